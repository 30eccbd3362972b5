"""Engine build command lines per image (pure), and running them with their output kept in a log.

A build is two steps: turn the Hugging Face checkpoint into a TensorRT-LLM checkpoint (`convert_checkpoint.py` of
the model's example folder, or `quantize.py` when quantizing; tensor/pipeline parallelism is fixed here), then
`trtllm-build` it into one engine per rank. What differs between TensorRT-LLM releases is asked of the image's named
capabilities (facts.features, facts.flags; from capabilities.yaml) and of its model list (models.Converter).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.model.support import Converter

if TYPE_CHECKING:
    from trtllm_entrypoint.config.image_facts import ImageFacts
    from trtllm_entrypoint.config.records import EngineSpec
    from trtllm_entrypoint.log import Log

CHECKPOINT_DIR = "checkpoint"  # the converted checkpoint, inside the build dir until the engine is built
TAIL_LINES = 20


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    name: str


def convert_script(facts: ImageFacts, converter: Converter, quantize: bool) -> Path:
    if quantize:
        return facts.app_dir / "examples" / "quantization" / "quantize.py"
    return converter.script(facts.app_dir)


def checkpoint_dtype(facts: ImageFacts, dtype: str) -> str:
    """Converters without automatic dtype (before 0.15) take 'auto' as float16."""
    return "float16" if dtype == "auto" and "converter_dtype_auto" not in facts.features else dtype


def _has_max_seq_len(facts: ImageFacts) -> bool:
    return "--max_seq_len" in facts.flags.get("trtllm-build", ())


def build_notes(facts: ImageFacts, spec: EngineSpec) -> list[str]:
    """What the build does differently from what the spec literally says, for the log."""
    notes = []
    if checkpoint_dtype(facts, spec.dtype) != spec.dtype:
        notes.append(
            f"DTYPE=auto converts as float16: TensorRT-LLM {facts.tensorrt_llm} cannot infer it "
            "(automatic dtype arrived in 0.15)"
        )
    if not _has_max_seq_len(facts):
        notes.append(
            f"TensorRT-LLM {facts.tensorrt_llm} has no --max_seq_len: passing --max_output_len "
            f"{spec.max_seq_len - spec.max_input_len} (MAX_SEQ_LEN - MAX_INPUT_LEN)"
        )
    return notes


def build_commands(
    facts: ImageFacts, spec: EngineSpec, model_dir: Path, out_dir: Path, work_dir: Path, converter: Converter
) -> list[Command]:
    if "engine_build" not in facts.features:
        raise UsageError(
            f"building engines needs TensorRT-LLM 0.9 or newer; this image has {facts.tensorrt_llm}",
            "build the engine elsewhere and set ENGINE_DIR, or use a newer image tag",
        )
    quantize = spec.quantization != "none"
    dtype = checkpoint_dtype(facts, spec.dtype)
    convert = [
        "python3",
        str(convert_script(facts, converter, quantize)),
        "--model_dir",
        str(model_dir),
        "--output_dir",
        str(work_dir),
        "--dtype",
        dtype,
        "--tp_size",
        str(spec.tp_size),
        "--pp_size",
        str(spec.pp_size),
    ]
    convert += ["--qformat", spec.quantization] if quantize else list(converter.args)
    return [
        Command(tuple(convert), "quantize" if quantize else "convert"),
        Command(trtllm_build_argv(facts, spec, dtype, work_dir, out_dir), "trtllm-build"),
    ]


def trtllm_build_argv(
    facts: ImageFacts, spec: EngineSpec, dtype: str, checkpoint_dir: Path, out_dir: Path
) -> tuple[str, ...]:
    argv = [
        "trtllm-build",
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(out_dir),
        "--gemm_plugin",
        dtype,
        "--max_batch_size",
        str(spec.max_batch_size),
        "--max_input_len",
        str(spec.max_input_len),
    ]
    if _has_max_seq_len(facts):
        argv += ["--max_seq_len", str(spec.max_seq_len)]
    else:
        argv += ["--max_output_len", str(spec.max_seq_len - spec.max_input_len)]
    argv += ["--max_num_tokens", str(spec.max_num_tokens), "--max_beam_width", str(spec.max_beam_width)]
    # In-flight batching needs a paged KV cache; 0.12 replaced the plugin switch by --kv_cache_type.
    if "--kv_cache_type" in facts.flags.get("trtllm-build", ()):
        argv += ["--kv_cache_type", "paged"]
    else:
        argv += ["--paged_kv_cache", "enable"]
    if spec.enable_kv_cache_reuse:
        argv += ["--use_paged_context_fmha", "enable"]  # KV cache reuse needs paged context FMHA
    if spec.world_size > 1:
        argv += ["--workers", str(spec.world_size)]  # one rank per GPU, built in parallel
    argv += spec.lora_flags  # LoRA adapters' plugin, modules and rank (model/adapter_set.py: lora_build)
    return tuple(argv)


def resolve_script(path: Path, tensorrt_llm: str) -> Path:
    if path.is_file():
        return path
    raise EntrypointError(
        f"{path} does not exist; the engine build for TensorRT-LLM {tensorrt_llm} needs it",
        "the images carry the TensorRT-LLM examples under their app dir: use the image built for "
        "this tag, or set TRTLLM_APP_DIR to a directory with the examples/ of this version",
    )


def run_commands(commands: Sequence[Command], log_path: Path, log: Log, environ: Mapping[str, str]) -> None:
    """Runs each command in turn, output appended (redacted) to `log_path`; stops at the first failure."""
    for command in commands:
        _run(command, log_path, log, environ)


def _run(command: Command, log_path: Path, log: Log, environ: Mapping[str, str]) -> None:
    line = shlex.join(command.argv)
    log.info("running", step=command.name, output=str(log_path))
    log.debug("running", step=command.name, command=line)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    started = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(log.redact(f"$ {line}\n"))
        out.flush()
        try:
            proc = subprocess.Popen(
                list(command.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(environ),
                text=True,
                encoding="utf-8",
                errors="replace",
            )
        except OSError as exc:
            raise EntrypointError(
                f"cannot run {command.name} ({command.argv[0]}): {exc.strerror}",
                "use the image built for this tag: it has the TensorRT-LLM tools",
            ) from None
        with proc, log.heartbeat("still running", step=command.name, output=str(log_path)):
            for raw in proc.stdout or ():
                text = log.redact(raw)
                out.write(text)
                tail.append(text.rstrip("\n"))
    seconds = round(time.monotonic() - started, 3)
    code = proc.returncode
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise EntrypointError(
            f"{command.name} {how} after {seconds}s; its last output:\n" + "\n".join(tail),
            f"the full output is in {log_path}",
        )
    log.info("step done", step=command.name, seconds=seconds)


def engine_builder(
    facts: ImageFacts, spec: EngineSpec, model_dir: Path, converter: Converter, log: Log, environ: Mapping[str, str]
) -> Callable[[Path, Path], None]:
    """The `build` callable for EngineCache.ensure. The intermediate checkpoint goes to out_dir/checkpoint, so a
    killed build leaves it inside the cache's temp dir (cleaned with it); it is removed before publication."""

    def build(out_dir: Path, log_path: Path) -> None:
        work_dir = out_dir / CHECKPOINT_DIR
        commands = build_commands(facts, spec, model_dir, out_dir, work_dir, converter)
        quantize = spec.quantization != "none"
        resolve_script(convert_script(facts, converter, quantize), facts.tensorrt_llm)
        for note in build_notes(facts, spec):
            log.info(note)
        run_commands(commands, log_path, log, environ)
        shutil.rmtree(work_dir)
        # Catches a trtllm-build of another install.
        engine_config.check_engine_version(engine_config.read(out_dir), facts.tensorrt_llm)

    return build
