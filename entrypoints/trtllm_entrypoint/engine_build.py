"""Engine build command lines per TensorRT-LLM version (pure), and running them with their output kept in a log.

A build is two steps: turn the Hugging Face checkpoint into a TensorRT-LLM checkpoint (`convert_checkpoint.py` of
the model's example folder, or `quantize.py` when quantizing; tensor/pipeline parallelism is fixed here), then
`trtllm-build` it into one engine per rank. The version thresholds follow TensorRT-LLM's release notes
("API Changes") and the argument parsers of `trtllm-build` and the converters at those releases.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from trtllm_entrypoint.engine_config import check_engine_version
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.facts import version_tuple

# 0.8 still built some families (GPT among them) with per-model legacy scripts; 0.9 finished the move.
MIN_VERSION = (0, 9)
CHECKPOINT_DIR = "checkpoint"  # the converted checkpoint, inside the build dir until the engine is built
TAIL_LINES = 20

# Hugging Face model_type -> TensorRT-LLM examples folder.
_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",        # examples/mixtral holds only a README that points at the llama converter
    "qwen": "qwen",            # Qwen 1 needs trust_remote_code checkpoints
    "qwen2": "qwen",
    "qwen2_moe": "qwen",       # uncertain: converter support appears around 0.11
    "gemma": "gemma",
    "gemma2": "gemma",         # uncertain: converter support appears around 0.13
    "phi": "phi",
    "phi3": "phi",             # uncertain: converter support appears around 0.10
    "gpt2": "gpt",
    "gpt_bigcode": "gpt",      # StarCoder / SantaCoder
    "starcoder2": "gpt",
    "gptj": "gptj",
    "gpt_neox": "gptneox",
    "falcon": "falcon",
    "RefinedWeb": "falcon",    # model_type of early Falcon checkpoints
    "RefinedWebModel": "falcon",
    "bloom": "bloom",
    "opt": "opt",
    "mpt": "mpt",
    "baichuan": "baichuan",
    "internlm2": "internlm2",
}
# From 0.20 the examples live under examples/models/core/ or, for these, examples/models/contrib/.
_CONTRIB = frozenset({"gptj", "gptneox", "falcon", "bloom", "opt", "mpt", "baichuan"})
_ARCH_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    name: str


def _normalise(name: str) -> str:
    return name.replace("_", "").lower()


_BY_NORMALISED = {_normalise(k): v for k, v in _MODEL_TYPES.items()}


def model_family(hf_config: dict) -> str:
    """The examples folder whose converter handles this checkpoint (config.json's model_type, else architectures)."""
    model_type = str(hf_config.get("model_type") or "")
    candidates = [model_type]
    for arch in hf_config.get("architectures") or []:
        for suffix in _ARCH_SUFFIXES:
            arch = arch[: -len(suffix)] if arch.endswith(suffix) else arch
        candidates.append(arch)
    for name in candidates:
        if name and _normalise(name) in _BY_NORMALISED:
            return _BY_NORMALISED[_normalise(name)]
    raise UsageError(
        f"no TensorRT-LLM engine recipe for model_type {model_type or '(none)'!r} "
        f"(architectures {hf_config.get('architectures') or []})",
        "supported model types: " + ", ".join(sorted(_MODEL_TYPES, key=str.lower))
        + "; otherwise build the engine yourself and set ENGINE_DIR, or use WORKFLOW=llmapi where the image has it")


def convert_script(app_dir: Path, tensorrt_llm: str, family: str, quantize: bool) -> Path:
    if quantize:
        return app_dir / "examples" / "quantization" / "quantize.py"
    if version_tuple(tensorrt_llm) < (0, 20):
        return app_dir / "examples" / family / "convert_checkpoint.py"
    area = "contrib" if family in _CONTRIB else "core"
    return app_dir / "examples" / "models" / area / family / "convert_checkpoint.py"


def checkpoint_dtype(tensorrt_llm: str, dtype: str) -> str:
    """The converters only infer the dtype from the checkpoint ('auto') from 0.15; before, auto means float16."""
    return "float16" if dtype == "auto" and version_tuple(tensorrt_llm) < (0, 15) else dtype


def build_notes(facts, settings) -> list[str]:
    """What the build does differently from what the settings literally say, for the log."""
    notes = []
    if checkpoint_dtype(facts.tensorrt_llm, settings.dtype) != settings.dtype:
        notes.append(f"DTYPE=auto converts as float16: TensorRT-LLM {facts.tensorrt_llm} cannot infer it "
                     "(automatic dtype arrived in 0.15)")
    if version_tuple(facts.tensorrt_llm) < (0, 11):
        notes.append(f"TensorRT-LLM {facts.tensorrt_llm} has no --max_seq_len: passing --max_output_len "
                     f"{settings.max_seq_len - settings.max_input_len} (MAX_SEQ_LEN - MAX_INPUT_LEN)")
    return notes


def build_commands(facts, settings, model_dir: Path, out_dir: Path, work_dir: Path, family: str) -> list[Command]:
    version = facts.tensorrt_llm
    if version_tuple(version) < MIN_VERSION:
        raise UsageError(f"building engines needs TensorRT-LLM 0.9 or newer; this image has {version}",
                         "build the engine elsewhere and set ENGINE_DIR, or use a newer image tag")
    quantize = settings.quantization != "none"
    dtype = checkpoint_dtype(version, settings.dtype)
    convert = ["python3", str(convert_script(facts.app_dir, version, family, quantize)),
               "--model_dir", str(model_dir), "--output_dir", str(work_dir), "--dtype", dtype,
               "--tp_size", str(settings.tp_size), "--pp_size", str(settings.pp_size)]
    if quantize:
        convert += ["--qformat", settings.quantization]
    return [Command(tuple(convert), "quantize" if quantize else "convert"),
            Command(trtllm_build_argv(version, settings, dtype, work_dir, out_dir), "trtllm-build")]


def trtllm_build_argv(version: str, settings, dtype: str, checkpoint_dir: Path, out_dir: Path) -> tuple[str, ...]:
    release = version_tuple(version)
    argv = ["trtllm-build", "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(out_dir),
            "--gemm_plugin", dtype,
            "--max_batch_size", str(settings.max_batch_size), "--max_input_len", str(settings.max_input_len)]
    if release >= (0, 11):
        argv += ["--max_seq_len", str(settings.max_seq_len)]
    else:
        argv += ["--max_output_len", str(settings.max_seq_len - settings.max_input_len)]
    argv += ["--max_num_tokens", str(settings.max_num_tokens), "--max_beam_width", str(settings.max_beam_width)]
    # In-flight batching needs a paged KV cache; 0.12 replaced the plugin switch by --kv_cache_type.
    argv += ["--kv_cache_type", "paged"] if release >= (0, 12) else ["--paged_kv_cache", "enable"]
    if settings.enable_kv_cache_reuse:
        argv += ["--use_paged_context_fmha", "enable"]  # KV cache reuse needs paged context FMHA
    world_size = settings.tp_size * settings.pp_size
    if world_size > 1:
        argv += ["--workers", str(world_size)]  # one rank per GPU, built in parallel
    return tuple(argv)


def resolve_script(path: Path, tensorrt_llm: str) -> Path:
    if path.is_file():
        return path
    raise EntrypointError(f"{path} does not exist; the engine build for TensorRT-LLM {tensorrt_llm} needs it",
                          "the images carry the TensorRT-LLM examples under their app dir: use the image built for "
                          "this tag, or set TRTLLM_APP_DIR to a directory with the examples/ of this version")


def run_commands(commands: Sequence[Command], log_path: Path, log, environ: Mapping[str, str]) -> None:
    """Runs each command in turn, output appended (redacted) to `log_path`; stops at the first failure."""
    for command in commands:
        _run(command, log_path, log, environ)


def _run(command: Command, log_path: Path, log, environ: Mapping[str, str]) -> None:
    line = shlex.join(command.argv)
    log.info("running", step=command.name, command=line)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    started = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(log.redact(f"$ {line}\n"))
        out.flush()
        try:
            proc = subprocess.Popen(list(command.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=dict(environ), text=True, encoding="utf-8",
                                    errors="replace")
        except OSError as exc:
            raise EntrypointError(f"cannot run {command.name} ({command.argv[0]}): {exc.strerror}",
                                  "use the image built for this tag: it has the TensorRT-LLM tools") from None
        with proc:
            for raw in proc.stdout:
                text = log.redact(raw)
                out.write(text)
                tail.append(text.rstrip("\n"))
    seconds = round(time.monotonic() - started, 3)
    code = proc.returncode
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise EntrypointError(f"{command.name} {how} after {seconds}s; its last output:\n" + "\n".join(tail),
                              f"the full output is in {log_path}")
    log.info("step done", step=command.name, seconds=seconds)


def engine_builder(facts, settings, model_dir: Path, family: str, log,
                   environ: Mapping[str, str]) -> Callable[[Path, Path], None]:
    """The `build` callable for EngineCache.ensure. The intermediate checkpoint goes to out_dir/checkpoint, so a
    killed build leaves it inside the cache's temp dir (cleaned with it); it is removed before publication."""
    def build(out_dir: Path, log_path: Path) -> None:
        work_dir = out_dir / CHECKPOINT_DIR
        commands = build_commands(facts, settings, model_dir, out_dir, work_dir, family)
        quantize = settings.quantization != "none"
        resolve_script(convert_script(facts.app_dir, facts.tensorrt_llm, family, quantize), facts.tensorrt_llm)
        for note in build_notes(facts, settings):
            log.info(note)
        run_commands(commands, log_path, log, environ)
        shutil.rmtree(work_dir)
        check_engine_version(out_dir, facts.tensorrt_llm)  # catches a trtllm-build of another install
    return build
