"""The flags the real NVIDIA programs take, per TensorRT-LLM release, for the doubles' `--help` and argument checks.

Recorded from ../shared/reference/engine-build-cli.md (trtllm-build's argument parser at several releases, release
notes "API Changes") and model-support.md (converter quirks). A range (since, until) means since <= release < until;
None is open. Kept independent of capabilities.yaml on purpose: the doubles play the programs, not our data.
Stdlib only, Python 3.10+ (runs inside the stand-in images too).
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata

ALWAYS = (None, None)

TRTLLM_BUILD = {
    **dict.fromkeys(
        (
            "--checkpoint_dir",
            "--model_config",
            "--output_dir",
            "--max_batch_size",
            "--max_input_len",
            "--max_num_tokens",
            "--max_beam_width",
            "--max_prompt_embedding_table_size",
            "--workers",
            "--log_level",
            "--timing_cache",
            "--tokens_per_block",
            "--gemm_plugin",
            "--gpt_attention_plugin",
            "--context_fmha",
            "--remove_input_padding",
            "--use_paged_context_fmha",
            "--multiple_profiles",
            "--paged_kv_cache",
            "--gather_generation_logits",
        ),
        ALWAYS,
    ),
    "--max_output_len": (None, (0, 12)),  # deprecated 0.11, removed 0.12
    "--max_seq_len": ((0, 11), None),
    "--kv_cache_type": ((0, 12), None),
    "--tp_size": ((0, 10), (0, 12)),  # only for some weight loaders; removed 0.12
    "--pp_size": ((0, 10), (0, 12)),
    "--context_fmha_fp32_acc": (None, (0, 12)),
    "--use_custom_all_reduce": (None, (0, 12)),
    "--multi_block_mode": (None, (0, 12)),
    "--strongly_typed": (None, (0, 11)),
    "--weight_only_precision": (None, (0, 11)),
    "--builder_opt": (None, (0, 14)),
    "--enable_xqa": (None, (0, 16)),
    "--auto_parallel": ((0, 9), None),
    "--use_fp8_context_fmha": ((0, 10), None),
    "--weight_streaming": ((0, 10), None),
    "--visualize_network": ((0, 10), None),
    "--dry_run": ((0, 10), None),
    "--fast_build": ((0, 12), None),
    "--reduce_fusion": ((0, 12), None),
    "--builder_force_num_profiles": ((0, 12), (0, 15)),
    "--monitor_memory": ((0, 17), None),
    # LoRA: build.py's own flags and the lora_plugin plugin flag (engine-build-cli.md snapshots from ~0.9 on)
    "--lora_plugin": ((0, 9), None),
    "--lora_target_modules": ((0, 9), None),
    "--max_lora_rank": ((0, 9), None),
    "--lora_dir": ((0, 9), None),
    "--lora_ckpt_source": ((0, 9), None),
}
# examples/hf_lora_convert.py (TensorRT-LLM's PEFT adapter converter; its argparse at main 05316d33 and later).
HF_LORA_CONVERT = dict.fromkeys(("--out-dir", "-o", "--in-file", "-i", "--verbose", "--storage-type"), ALWAYS)

CONVERTER = dict.fromkeys(
    (
        "--model_dir",
        "--output_dir",
        "--dtype",
        "--tp_size",
        "--pp_size",
        "--workers",
        "--load_model_on_cpu",
        "--use_weight_only",
        "--weight_only_precision",
        "--int8_kv_cache",
        "--smoothquant",
        "--per_channel",
        "--per_token",
        "--calib_dataset",
    ),
    ALWAYS,
)
# Converter folder -> its own flags (model-support.md: "Some converters need extra flags at some tags").
CONVERTER_EXTRA = {
    "qwen": {"--qwen_type": ((0, 10), (0, 11))},
    "phi": {"--model_type": ((0, 10), (0, 11))},
    "gpt": {"--gpt_variant": ALWAYS},
    "chatglm": {"--chatglm_version": ALWAYS},
}
QUANTIZE = dict.fromkeys(
    (
        "--model_dir",
        "--output_dir",
        "--dtype",
        "--tp_size",
        "--pp_size",
        "--qformat",
        "--kv_cache_dtype",
        "--calib_size",
        "--batch_size",
        "--device",
        "--seed",
        "--tokenizer_max_seq_length",
    ),
    ALWAYS,
)
# The long options `tritonserver --help` lists (2.51.0, from the nvidia-pytriton 0.7.0 wheel); the doubles of other
# Triton releases answer with the same set.
TRITONSERVER = (
    "--allow-cpu-metrics",
    "--allow-gpu-metrics",
    "--allow-grpc",
    "--allow-http",
    "--allow-metrics",
    "--allow-sagemaker",
    "--allow-vertex-ai",
    "--backend-config",
    "--backend-directory",
    "--buffer-manager-thread-count",
    "--cache-config",
    "--cache-directory",
    "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size",
    "--disable-auto-complete-config",
    "--enable-peer-access",
    "--exit-on-error",
    "--exit-timeout-secs",
    "--grpc-address",
    "--grpc-header-forward-pattern",
    "--grpc-http2-max-ping-strikes",
    "--grpc-http2-max-pings-without-data",
    "--grpc-http2-min-recv-ping-interval-without-data",
    "--grpc-infer-allocation-pool-size",
    "--grpc-infer-response-compression-level",
    "--grpc-keepalive-permit-without-calls",
    "--grpc-keepalive-time",
    "--grpc-keepalive-timeout",
    "--grpc-max-connection-age",
    "--grpc-max-connection-age-grace",
    "--grpc-port",
    "--grpc-restricted-protocol",
    "--grpc-root-cert",
    "--grpc-server-cert",
    "--grpc-server-key",
    "--grpc-use-ssl",
    "--grpc-use-ssl-mutual",
    "--help",
    "--host-policy",
    "--http-address",
    "--http-header-forward-pattern",
    "--http-port",
    "--http-restricted-api",
    "--http-thread-count",
    "--id",
    "--load-model",
    "--log-error",
    "--log-file",
    "--log-format",
    "--log-info",
    "--log-verbose",
    "--log-warning",
    "--metrics-address",
    "--metrics-config",
    "--metrics-interval-ms",
    "--metrics-port",
    "--min-supported-compute-capability",
    "--model-config-name",
    "--model-control-mode",
    "--model-load-gpu-limit",
    "--model-load-retry-count",
    "--model-load-thread-count",
    "--model-namespacing",
    "--model-repository",
    "--model-store",
    "--pinned-memory-pool",
    "--pinned-memory-pool-byte-size",
    "--rate-limit",
    "--rate-limit-resource",
    "--repoagent-directory",
    "--repository-poll-secs",
    "--response-cache-byte-size",
    "--reuse-grpc-port",
    "--reuse-http-port",
    "--sagemaker-port",
    "--sagemaker-safe-port-range",
    "--sagemaker-thread-count",
    "--strict-model-config",
    "--strict-readiness",
    "--trace-config",
    "--trace-count",
    "--trace-file",
    "--trace-level",
    "--trace-log-frequency",
    "--trace-rate",
    "--vertex-ai-default-model",
    "--vertex-ai-port",
    "--vertex-ai-thread-count",
)
DTYPE_AUTO_SINCE = (0, 15)  # converters and quantize.py accept --dtype auto from 0.15


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release: '0.17.0.post1' -> (0, 17, 0)."""
    return tuple(int(part) for part in re.match(r"\d+(?:\.\d+){0,2}", version).group().split("."))


def installed_release() -> tuple[int, ...]:
    try:
        return release(metadata.version("tensorrt_llm"))
    except metadata.PackageNotFoundError:
        return release(os.environ.get("TRTLLM_DOUBLE_VERSION", "0.0.0"))


def flags_at(table: dict, version: tuple[int, ...]) -> list[str]:
    return [
        flag
        for flag, (since, until) in table.items()
        if (since is None or version >= since) and (until is None or version < until)
    ]


def program_flags(program: str, version: tuple[int, ...], folder: str = "") -> list[str]:
    if program == "tritonserver":
        return list(TRITONSERVER)
    if program == "trtllm-build":
        return flags_at(TRTLLM_BUILD, version)
    if program == "quantize":
        return flags_at(QUANTIZE, version)
    if program == "hf_lora_convert":
        return flags_at(HF_LORA_CONVERT, version)
    return flags_at({**CONVERTER, **CONVERTER_EXTRA.get(folder, {})}, version)


def usage(program: str, flags: list[str]) -> str:
    """An argparse-style help text."""
    upper = [f"[{flag} {flag[2:].upper()}]" for flag in flags]
    return (
        f"usage: {program} [-h] "
        + " ".join(upper)
        + "\n\n(trtllm-images test double)\n\noptions:\n"
        + "".join(f"  {flag} {flag[2:].upper()}\n" for flag in flags)
    )


def parse_or_exit(program: str, argv: list[str], folder: str = "") -> None:
    """What the real argparse does: print help and exit 0 on --help; exit 2 on a flag this release lacks, or on
    --dtype auto before 0.15."""
    version = installed_release()
    known = program_flags(program, version, folder)
    if "-h" in argv or "--help" in argv:
        print(usage(program, known))
        sys.exit(0)
    unknown = sorted({arg.split("=", 1)[0] for arg in argv if arg.startswith("--")} - set(known))
    if unknown:
        print(f"{program}: error: unrecognized arguments: {' '.join(unknown)}", file=sys.stderr)
        sys.exit(2)
    if program != "trtllm-build" and version < DTYPE_AUTO_SINCE and "auto" in _values(argv, "--dtype"):
        print(f"{program}: error: argument --dtype: invalid choice: 'auto'", file=sys.stderr)
        sys.exit(2)


def _values(argv: list[str], flag: str) -> list[str]:
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(flag + "=")]
    values += [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]
    return values
