"""The adapters as the backend loads them, kept in the cache: `CACHE_DIR/adapters/<key>/<task id>/model.lora_
{weights,config}.npy`, the layout the tensorrt_llm model's `lora_prefetch_dir` reads at start.

The key is every adapter's name, content digest and task id, the storage dtype and TensorRT-LLM's release
(model/adapter_set.py: set_key): the same adapters are converted once, by one replica, and served by all; another set
gets another directory, so a server never sees a half-changed one. Conversion runs TensorRT-LLM's own
examples/hf_lora_convert.py once per adapter (its output kept in convert.log), then each task folder is checked
before the directory is published (publish.py: temp dir, stamp, rename, lock against other replicas).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.engine.build import Command, run_commands
from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.model import adapter_set
from trtllm_entrypoint.storage import publish

if TYPE_CHECKING:
    from trtllm_entrypoint.log import Log
    from trtllm_entrypoint.model.adapters import Adapter

ROOT = "adapters"
STAMP = "stamp.json"
CONVERT_LOG = "convert.log"
SCHEMA = 1
LOCK_HINT = "another replica is still converting these adapters: wait longer with a larger LOCK_TIMEOUT_SECS"


def entry_problem(entry: Path, key: str, served: Sequence[Adapter]) -> str | None:
    problem = publish.problem(entry, STAMP, {"schema": SCHEMA, "key": key}, optional=(CONVERT_LOG,))
    if problem is not None:
        return problem
    return next((p for a in served if (p := adapter_set.layout_problem(entry / str(a.task_id), a))), None)


def ensure(
    served: Sequence[Adapter],
    *,
    storage: str,
    tensorrt_llm: str,
    script: Path,
    cache_dir: Path,
    log: Log,
    environ: Mapping[str, str],
    timeout_s: float,
) -> Path:
    """The prefetch directory of `served`, converted now unless the cache has it complete."""
    key = adapter_set.set_key(served, storage, tensorrt_llm)
    entry = cache_dir / ROOT / key
    if entry.exists() and entry_problem(entry, key, served) is None:
        log.info("adapters cache hit", key=key, path=str(entry), adapters=len(served))
        return entry
    if not script.is_file():
        raise EntrypointError(
            f"{script} does not exist; converting LoRA adapters needs TensorRT-LLM's hf_lora_convert.py",
            "use the image built for this tag (its app dir carries TensorRT-LLM's examples), or set TRTLLM_APP_DIR",
        )
    publish.sweep(entry.parent, log)
    waiting = f"waiting for another process converting adapters {key}"
    with publish.locked(entry, timeout_s, log, waiting, LOCK_HINT, output=CONVERT_LOG):
        if entry.exists() and entry_problem(entry, key, served) is None:
            log.info("adapters cache hit after waiting", key=key, path=str(entry))
            return entry
        publish.remove_leftovers(entry, log)
        if entry.exists():  # everything under CACHE_DIR/adapters is ours; an invalid copy is not kept
            publish.discard(entry, log, entry_problem(entry, key, served) or "invalid")

        def fill(tmp: Path) -> dict[str, object]:
            started = time.monotonic()
            commands = [
                Command(adapter_set.convert_argv("python3", script, a, tmp, storage), f"convert adapter {a.name}")
                for a in served
            ]
            with log.phase("adapter conversion", key=key, adapters=len(served), log_path=str(tmp / CONVERT_LOG)):
                run_commands(commands, tmp / CONVERT_LOG, log, environ)
            for adapter in served:
                problem = adapter_set.layout_problem(tmp / str(adapter.task_id), adapter)
                if problem is not None:
                    raise EntrypointError(
                        f"hf_lora_convert.py's output for adapter {adapter.name!r} is not what the backend loads: "
                        f"{problem}",
                        f"run {script.name} --in-file {adapter.path} by hand to see what it makes of the adapter",
                    )
            return {"convert_s": round(time.monotonic() - started, 3)}

        stamp = {
            "schema": SCHEMA,
            "key": key,
            "storage": storage,
            "tensorrt_llm": tensorrt_llm,
            "adapters": {a.name: {"task_id": a.task_id, "digest": a.digest} for a in served},
        }
        publish.publish(entry, fill, stamp, STAMP, log)
    log.info("adapters converted", key=key, path=str(entry), adapters=len(served))
    return entry
