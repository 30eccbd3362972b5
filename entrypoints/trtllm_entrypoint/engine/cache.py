"""The engine cache under `<cache_dir>/engines/`: keys, and engines built once and published by `publish`.

    <key>/                    a published engine: config.json, rank*.engine, build.log, stamp.json
    .<key>.new-<rand>/        a build in progress (or the leftovers of a killed one, removed by the next start)
    .<key>.lock               the key's lock: only its holder builds, so replicas build an engine once
    <key>.failed-<pid>.log    output of a failed build (a build writes build.log inside its temp dir)

A published engine is checked at every start (stamp, sizes, config.json's content, one rank file per rank); an
invalid one is removed under the lock and rebuilt, never kept as a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.config.records import EngineSpec
from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.storage import publish, trust

if TYPE_CHECKING:
    from trtllm_entrypoint.config.gpu import GpuInfo
    from trtllm_entrypoint.config.image_facts import ImageFacts
    from trtllm_entrypoint.log import Log

# Bump when the layout, the stamp or the build commands change: old entries then no longer match any key.
SCHEMA = 3  # 3: local models are named by their content digest (not their path)
KEY_LENGTH = 20
STAMP = "stamp.json"
BUILD_LOG = "build.log"
LOCK_HINT = (
    "another process is still building this engine (a dead holder releases the lock): wait longer with a "
    "larger LOCK_TIMEOUT_SECS; on a shared volume, check that it supports flock"
)


def cache_key(inputs: dict[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def key_inputs(
    model_identity: dict[str, Any], spec: EngineSpec, facts: ImageFacts, gpu_info: GpuInfo
) -> dict[str, Any]:
    """Everything an engine depends on: the model, every field of the spec the build commands read, the versions
    and the compute capability. Engines are specific to the compute capability, not to the GPU count actually
    present (the mapping is fixed by tp/pp), so names and count go into the stamp only."""
    return {
        "schema": SCHEMA,
        "model": model_identity,
        # lora_flags only when there are adapters: engines keyed before LORA_DIR existed keep their keys.
        "build": {
            f.name: getattr(spec, f.name) for f in fields(EngineSpec) if f.name != "lora_flags" or spec.lora_flags
        },
        "tensorrt_llm": facts.tensorrt_llm,
        "tensorrt": facts.tensorrt,
        "compute_capability": gpu_info.compute_capability,
    }


def stamp_inputs(
    inputs: dict[str, Any], facts: ImageFacts, gpu_info: GpuInfo, model_path: Path | None = None
) -> dict[str, Any]:
    """The key inputs plus what is worth knowing about the builder but must not split the cache: the image tag, the
    GPUs, and where the model was read from (the same bytes elsewhere share the engine)."""
    gpus = {"count": gpu_info.count, "names": list(gpu_info.names)}
    return {
        **inputs,
        "image_tag": facts.tag,
        "gpus": gpus,
        "model_path": None if model_path is None else str(model_path),
    }


def _entry_problem(entry: Path, key: str) -> str | None:
    """Why `entry` is not a complete published engine for `key`, or None when it is."""
    if not (entry / STAMP).is_file():
        return f"{STAMP} is missing (an unfinished copy, or not made by this cache)"
    try:
        missing = engine_config.read(entry).missing_ranks()
    except EntrypointError as exc:
        return exc.message
    if missing:
        return "missing " + ", ".join(missing)
    return publish.problem(entry, STAMP, {"key": key}, optional=(BUILD_LOG,))


class EngineCache:
    def __init__(self, root: Path):
        self.root = root

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str, log: Log | None = None) -> Path | None:
        """The published entry for `key` if it is complete; an incomplete one counts as absent (and is logged)."""
        entry = self.entry(key)
        if not entry.exists():
            return None
        problem = _entry_problem(entry, key)
        if problem is None:
            return entry
        if log is not None:
            log.warn("ignoring invalid engine cache entry", path=str(entry), reason=problem)
        return None

    def ensure(
        self, key: str, stamp_inputs: dict[str, Any], build: Callable[[Path, Path], None], *, timeout_s: float, log: Log
    ) -> tuple[Path, bool]:
        """The published entry for `key`, built by `build(tmp_dir, log_path)` unless it exists; (entry, built_now)."""
        found = self.lookup(key, log)
        if found is not None:
            log.info("engine cache hit", key=key, path=str(found))
            return self.served(found, key, timeout_s=timeout_s, log=log), False
        publish.sweep(self.root, log)
        waited_since = time.monotonic()
        entry = self.entry(key)
        waiting = f"waiting for another process building {key}"
        with publish.locked(entry, timeout_s, log, waiting, LOCK_HINT, output=BUILD_LOG):
            found = self.lookup(key)
            if found is not None:  # another replica published it while we waited for the lock
                log.info("engine cache hit after waiting", key=key, path=str(found))
                return self.served(found, key, timeout_s=timeout_s, log=log), False
            publish.remove_leftovers(entry, log)
            if entry.exists():  # everything under CACHE_DIR/engines is ours; an invalid copy is not kept
                publish.discard(entry, log, _entry_problem(entry, key) or "invalid")
            lock_wait = round(time.monotonic() - waited_since, 3)
            built = self._build(key, stamp_inputs, build, lock_wait, log)
        return self.served(built, key, timeout_s=timeout_s, log=log), True

    def private(self, key: str) -> Path:
        return self.root / f"{key}.uid{os.geteuid()}"

    def served(self, entry: Path, key: str, *, timeout_s: float, log: Log) -> Path:
        """`entry` when no other UID could change it before the server loads it (trust.untrusted), else this UID's
        private copy beside it: made once from the entry, checked against the entry's own stamp, then reused."""
        held = trust.renamable(self.root)  # another UID could move the entry away, however well it checks
        reason = held or trust.untrusted(entry)
        if reason is None:
            return entry
        private = trust.private_root(self.root) / key if held else self.private(key)
        if private.exists() and _entry_problem(private, key) is None and trust.untrusted(private) is None:
            log.info("serving this UID's private copy of the engine", path=str(private), because=reason)
            return private
        log.info("copying the engine privately: another UID could change it", path=str(entry), because=reason)
        waiting = f"waiting for another process copying {key}"
        with publish.locked(private, timeout_s, log, waiting, LOCK_HINT):
            publish.remove_leftovers(private, log)
            if private.exists():
                publish.discard(private, log, _entry_problem(private, key) or "not this UID's alone")

            def fill(tmp: Path) -> None:
                shutil.copytree(entry, tmp, symlinks=True, dirs_exist_ok=True)
                links = [p for p in tmp.rglob("*") if p.is_symlink()]
                # The copy is checked against the entry's own stamp: what the builder recorded, not what is there now.
                problem = f"{links[0].name} is a symbolic link" if links else _entry_problem(tmp, key)
                if problem is not None:
                    raise EntrypointError(f"the cached engine {entry} cannot be copied intact: {problem}", LOCK_HINT)

            publish.publish(private, fill, {"schema": SCHEMA, "key": key, "copied_from": str(entry)}, STAMP, log)
        return private

    def _keep_failed_log(self, key: str, log_path: Path, log: Log) -> Path | None:
        """Moves the output out of the temp dir before it is removed; where it went, or None when none was written."""
        kept = self.root / f"{key}.failed-{os.getpid()}.log"
        try:
            os.replace(log_path, kept)
        except OSError:
            return None
        log.error("the failed build's output is kept", path=str(kept))
        return kept

    def _build(
        self, key: str, stamp_inputs: dict[str, Any], build: Callable[[Path, Path], None], lock_wait: float, log: Log
    ) -> Path:
        def fill(tmp: Path) -> dict[str, Any]:
            # The log lives inside our own temp dir, so no other UID's file is ever truncated; published with it.
            started = time.monotonic()
            with log.phase("engine build", key=key, log_path=str(tmp / BUILD_LOG)):
                build(tmp, tmp / BUILD_LOG)
            return {"durations": {"lock_wait_s": lock_wait, "build_s": round(time.monotonic() - started, 3)}}

        stamp = {
            "schema": SCHEMA,
            "key": key,
            "inputs": stamp_inputs,
            "builder": {"host": socket.gethostname(), "pid": os.getpid()},
        }
        kept: list[Path] = []

        def keep_log(tmp: Path, _error: BaseException) -> None:
            kept.extend(path for path in [self._keep_failed_log(key, tmp / BUILD_LOG, log)] if path)

        try:
            final = publish.publish(self.entry(key), fill, stamp, STAMP, log, on_failure=keep_log)
        except EntrypointError as exc:
            if not kept:
                raise
            # The builder's message stands; where its full output now is, only the cache knows.
            raise type(exc)(exc.message, f"the full output is in {kept[0]}") from None
        log.info("engine published", key=key, path=str(final))
        return final
