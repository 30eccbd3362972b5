"""The engine cache: keys, stamps, an inter-process lock and atomic publication under `<cache_dir>/engines/`.

Layout of the root directory:

    <key>/                        a published engine: config.json, rank*.engine, build.log, stamp.json
    .tmp-<key>-<pid>-<rand>/      a build in progress (or the debris of a killed one)
    <key>.lock                    flock(2) target; holds "who builds" for log messages; never deleted
    <key>.failed-<pid>.log        output of a failed build (a build writes build.log inside its temp dir)
    <key>.invalid-<time>/         a published directory that failed validation, moved aside for inspection

Only the holder of the key's lock builds, writes stamp.json last and renames the temp dir into place, so a reader
either sees a complete entry or none. The kernel drops a flock when its holder dies (even by SIGKILL), which is the
stale-lock recovery; the next holder removes the dead build's temp dirs. On a shared volume the filesystem must
support flock across clients: local filesystems do, and Linux maps flock to NFSv4 byte-range locks (lease-based, so
a crashed client's lock is released when its lease expires).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.facts import version_tuple
from trtllm_entrypoint.paths import open_lock, shared_dir

# Bump when the layout, the stamp or the build commands change: old entries then no longer match any key.
SCHEMA = 1
KEY_LENGTH = 20
STAMP = "stamp.json"
BUILD_LOG = "build.log"
ENGINE_CONFIG = "config.json"
LOCK_POLL_S = 0.05  # a waiting replica starts at most this long after the build is published

# Settings that change the built engine. Ports, streaming (decoupled), the KV-cache memory fraction and the
# frontend are runtime choices and deliberately absent, so changing them reuses the engine.
BUILD_SETTINGS = (
    "dtype", "quantization", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
    "max_beam_width", "tp_size", "pp_size",
    "enable_kv_cache_reuse",  # turns on paged context FMHA at build time
)


def cache_key(inputs: dict) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def key_inputs(model_identity: dict, settings, facts, gpu_info) -> dict:
    """Everything an engine depends on. Engines are specific to the compute capability, not to the GPU count
    actually present (the mapping is fixed by tp/pp), so names and count go into the stamp only."""
    return {
        "schema": SCHEMA,
        "model": model_identity,
        "build": {name: getattr(settings, name) for name in BUILD_SETTINGS},
        "tensorrt_llm": facts.tensorrt_llm,
        "tensorrt": facts.tensorrt,
        "compute_capability": gpu_info.compute_capability,
    }


def stamp_inputs(inputs: dict, facts, gpu_info) -> dict:
    """The key inputs plus what is worth knowing about the builder but must not split the cache."""
    return {**inputs, "image_tag": facts.tag, "gpus": {"count": gpu_info.count, "names": list(gpu_info.names)}}


def _read_engine_config(engine_dir: Path) -> dict:
    path = engine_dir / ENGINE_CONFIG
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise EntrypointError(f"{path} does not exist", "an engine directory holds config.json and rank*.engine "
                              "as written by trtllm-build") from None
    except (OSError, ValueError) as exc:
        raise EntrypointError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise EntrypointError(f"{path} is not a JSON object")
    return config


def engine_world_size(engine_dir: Path) -> int:
    """Ranks the engine was built for (one rank*.engine each): mapping.world_size, else tp*pp, else 1."""
    mapping = (_read_engine_config(engine_dir).get("pretrained_config") or {}).get("mapping") or {}
    try:
        if "world_size" in mapping:
            return int(mapping["world_size"])
        return int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
    except (TypeError, ValueError):
        raise EntrypointError(f"{engine_dir / ENGINE_CONFIG} has a malformed pretrained_config.mapping: "
                              f"{mapping!r}") from None


def check_engine_version(engine_dir: Path, installed: str) -> None:
    """Engines only load with the exact TensorRT-LLM version that built them."""
    built_with = _read_engine_config(engine_dir).get("version")
    rebuild = ("rebuild it with the builder image of this tag, or set MODEL_ID to the model checkpoint "
               "so the engine is built here")
    if built_with is None:
        raise EntrypointError(f"the engine in {engine_dir} has no version in config.json: it was built by the "
                              f"legacy per-model build scripts and cannot run with TensorRT-LLM {installed}", rebuild)
    if built_with != installed:
        same_release = version_tuple(str(built_with)) == version_tuple(installed)
        detail = " (same release, different build: engines need the exact version)" if same_release else ""
        raise EntrypointError(f"the engine in {engine_dir} was built with TensorRT-LLM {built_with}, this image has "
                              f"{installed}{detail}", rebuild)


def _entry_problem(entry: Path, key: str) -> str | None:
    """Why `entry` is not a complete published engine for `key`, or None when it is."""
    try:
        stamp = json.loads((entry / STAMP).read_text())
    except FileNotFoundError:
        return f"{STAMP} is missing (an unfinished copy, or not made by this cache)"
    except (OSError, ValueError) as exc:
        return f"{STAMP} is unreadable: {exc}"
    if not isinstance(stamp, dict) or stamp.get("key") != key:
        return f"{STAMP} does not belong to key {key}"
    try:
        world_size = engine_world_size(entry)
    except EntrypointError as exc:
        return exc.message
    missing = [f"rank{rank}.engine" for rank in range(world_size) if not (entry / f"rank{rank}.engine").is_file()]
    if missing:
        return "missing " + ", ".join(missing)
    for name, size in (stamp.get("files") or {}).items():
        if name == BUILD_LOG:
            continue  # only informative: deleting it must not cost a rebuild
        path = entry / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} is missing or does not have the size recorded in {STAMP} ({size} bytes)"
    return None


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            _fsync_path(Path(dirpath, name))
        _fsync_path(Path(dirpath), directory=True)


def _file_sizes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class EngineCache:
    def __init__(self, root: Path):
        self.root = root

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str, log=None) -> Path | None:
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

    def ensure(self, key: str, stamp_inputs: dict, build: Callable[[Path, Path], None], *,
               timeout_s: float, log) -> tuple[Path, bool]:
        """The published entry for `key`, built by `build(tmp_dir, log_path)` unless it exists; (entry, built_now)."""
        found = self.lookup(key, log)
        if found is not None:
            log.info("engine cache hit", key=key, path=str(found))
            return found, False
        shared_dir(self.root)
        waited_since = time.monotonic()
        with self._locked(key, timeout_s, log):
            found = self.lookup(key)  # an invalid entry is reported by _clear_debris
            if found is not None:  # another replica published it while we waited for the lock
                log.info("engine cache hit after waiting", key=key, path=str(found))
                return found, False
            self._clear_debris(key, log)
            lock_wait = round(time.monotonic() - waited_since, 3)
            return self._build(key, stamp_inputs, build, lock_wait, log), True

    @contextmanager
    def _locked(self, key: str, timeout_s: float, log) -> Iterator[None]:
        lock_path = self.root / f"{key}.lock"
        fd = open_lock(lock_path)
        try:
            deadline = time.monotonic() + timeout_s
            announced = False
            while not _try_flock(fd):
                holder = _read_holder(fd)
                if time.monotonic() >= deadline:
                    raise EntrypointError(
                        f"gave up after {timeout_s:g}s waiting for the engine build lock {lock_path} "
                        f"(held by {holder})",
                        "another process is still building this engine (a dead holder releases the lock): wait "
                        "longer with a larger LOCK_TIMEOUT_SECS; on a shared volume, check that it supports flock")
                if not announced:
                    log.info(f"waiting for another process building {key}", holder=holder, lock=str(lock_path))
                    announced = True
                time.sleep(LOCK_POLL_S)
            _write_holder(fd)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    def _clear_debris(self, key: str, log) -> None:
        """Under the key's lock nobody else builds it, so its temp dirs belong to dead builders."""
        for debris in self.root.glob(f".tmp-{key}-*"):
            log.warn("removing the leftovers of an interrupted engine build", path=str(debris))
            shutil.rmtree(debris, ignore_errors=True)
        entry = self.entry(key)
        if entry.exists():
            aside = self.root / f"{key}.invalid-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
            log.warn("moving an invalid engine cache entry aside before rebuilding",
                     path=str(entry), moved_to=str(aside), reason=_entry_problem(entry, key))
            try:
                os.rename(entry, aside)
            except PermissionError:
                raise EntrypointError(f"the invalid engine cache entry {entry} belongs to another user and cannot "
                                      "be moved aside", "remove it, or give each UID its own CACHE_DIR") from None

    def _keep_failed_log(self, key: str, log_path: Path, log, error: BaseException) -> None:
        """Moves the output out of the temp dir before it is removed, and points the error at the new place."""
        kept = self.root / f"{key}.failed-{os.getpid()}.log"
        try:
            os.replace(log_path, kept)
        except OSError:
            return  # nothing was written yet
        log.error("the failed build's output is kept", path=str(kept))
        if isinstance(error, EntrypointError):
            error.message = error.message.replace(str(log_path), str(kept))
            error.hint = error.hint.replace(str(log_path), str(kept))

    def _build(self, key: str, stamp_inputs: dict, build: Callable[[Path, Path], None], lock_wait: float,
               log) -> Path:
        tmp = self.root / f".tmp-{key}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir(mode=0o755)
        # Inside our own temp dir, so no other UID's file is ever truncated; published with the engine.
        log_path = tmp / BUILD_LOG
        try:
            started = time.monotonic()
            with log.phase("engine build", key=key, log_path=str(log_path)):
                build(tmp, log_path)
            build_seconds = round(time.monotonic() - started, 3)
            stamp = {
                "schema": SCHEMA, "key": key, "inputs": stamp_inputs, "created": _utc_now(),
                "builder": {"host": socket.gethostname(), "pid": os.getpid()},
                "durations": {"lock_wait_s": lock_wait, "build_s": build_seconds},
                "files": _file_sizes(tmp),
            }
            (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")  # last: marks completion
            _fsync_tree(tmp)
            final = self.entry(key)
            os.rename(tmp, final)
            _fsync_path(self.root, directory=True)
        except BaseException as error:
            self._keep_failed_log(key, log_path, log, error)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("engine published", key=key, path=str(final))
        return final


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _write_holder(fd: int) -> None:
    holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": _utc_now()}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder, 0)
    except OSError:
        pass  # read-only descriptor: the holder record is only for messages


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"
