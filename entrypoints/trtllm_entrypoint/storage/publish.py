"""The one way a directory is published (an engine, a model repository): a reader sees a complete copy or none, a
killed writer leaves only leftovers the next start removes, and nothing we did not write is ever deleted.

Beside a published directory `<name>` in its parent `<root>`:

    <name>/                 the published copy; its stamp (written last) records every file's size, and the sha256
                            of the small ones, and marks the directory as ours
    .<name>.new-<rand>/     a copy being built, or the leftovers of a killed build
    .<name>.old-<rand>/     a replaced or invalid copy being removed, or the leftovers of a killed removal
    .<name>.lock            flock(2) target, naming its holder for messages; never deleted

Every step that creates or removes one of these holds `.<name>.lock`, so leftovers whose lock is free belong to a
dead process. The kernel drops a flock when its holder dies (even by SIGKILL); on a shared volume the file system
must support flock across clients (local file systems do; Linux maps it to NFSv4 locks).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.storage import trust
from trtllm_entrypoint.storage.paths import open_lock, shared_dir

if TYPE_CHECKING:
    from trtllm_entrypoint.log import Log

SMALL_FILE = 1 << 20  # files up to this size are hashed in the stamp (configs); larger ones (engines) by size only
LOCK_POLL_S = 0.05
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?:new|old)-[A-Za-z0-9_]+")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def manifest(directory: Path, stamp_name: str) -> dict[str, dict[str, Any]]:
    """Every file below `directory` but the stamp: its size, and the sha256 of a small one."""
    files = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if not path.is_file() or relative == stamp_name:
            continue
        size = path.stat().st_size
        record: dict[str, Any] = {"size": size}
        if size <= SMALL_FILE:
            record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        files[relative] = record
    return files


def is_ours(path: Path, stamp_name: str) -> bool:
    """A directory we published carries our stamp (even a damaged one: the name alone is the marker)."""
    return (path / stamp_name).is_file()


def listed(path: Path, stamp_name: str) -> tuple[set[str], set[str] | None]:
    """(files, directories) our stamp in `path` records, as relative paths; nothing when it is missing or unreadable.
    Directories are None in stamps written before they were recorded."""
    try:
        stamp = json.loads((path / stamp_name).read_text())
        files, dirs = stamp.get("files"), stamp.get("dirs")
    except (OSError, ValueError, AttributeError):
        return set(), set()
    return (set(files) if isinstance(files, dict) else set()), (set(dirs) if isinstance(dirs, list) else None)


def directories(root: Path) -> list[str]:
    """Every directory below `root`, relative: empty ones (a model's version folder) are ours too."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir() and not p.is_symlink())


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None


def problem(path: Path, stamp_name: str, expected: Mapping[str, object], optional: tuple[str, ...] = ()) -> str | None:
    """Why `path` is not a complete copy published with `expected` stamp values, or None when it is.

    Files named in `optional` (a build log) may be missing: deleting them must not cost a rebuild."""
    try:
        stamp = json.loads((path / stamp_name).read_text())
    except FileNotFoundError:
        return f"{stamp_name} is missing (an unfinished copy, or not made by us)"
    except (OSError, ValueError) as exc:
        return f"{stamp_name} is unreadable: {exc}"
    if not isinstance(stamp, dict):
        return f"{stamp_name} is not a JSON object"
    for name, value in expected.items():
        if stamp.get(name) != value:
            return f"{stamp_name} does not belong to {name} {value}"
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return f"{stamp_name} records no files"
    for relative, record in files.items():
        if relative in optional:
            continue
        file = path / relative
        if not isinstance(record, dict) or not file.is_file() or file.stat().st_size != record.get("size"):
            return f"{relative} is missing or does not have the size recorded in {stamp_name}"
        digest = record.get("sha256")
        if digest and hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            return f"{relative} differs from the content recorded in {stamp_name}"
    return None


# --- locks --------------------------------------------------------------------------------------------------------


def try_flock(fd: int, mode: int = fcntl.LOCK_EX) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def write_holder(fd: int, **extra: object) -> None:
    holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now(), **extra}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder, 0)
    except OSError:
        pass  # read-only descriptor: the holder record is only for messages


def read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


def holder_output(lock: Path, output: str) -> str | None:
    """The file `output` in the copy the lock's holder is building (`.<name>.new-*/<output>`), if there is one."""
    name = lock.name.removeprefix(".").removesuffix(".lock")
    found = sorted(lock.parent.glob(f".{glob.escape(name)}.new-*/{glob.escape(output)}"))
    return str(found[0]) if found else None


def wait_for(
    fd: int,
    lock: Path,
    timeout_s: float,
    log: Log,
    waiting: str,
    hint: str,
    attempt: Callable[[], bool] | None = None,
    output: str | None = None,
) -> None:
    """Poll until `attempt` (an exclusive flock by default) succeeds; a timeout error names the lock and holder.
    While waiting, a heartbeat names the holder and where the holder writes `output` (its build log)."""
    attempt = attempt or (lambda: try_flock(fd))
    if attempt():
        return
    deadline = time.monotonic() + timeout_s
    log.info(waiting, holder=read_holder(fd), lock=str(lock))

    def progress(_elapsed: float) -> dict[str, object]:
        kept = holder_output(lock, output) if output else None
        return {"holder": read_holder(fd), **({"output": kept} if kept else {})}

    with log.heartbeat("still " + waiting, progress, lock=str(lock)):
        while not attempt():
            if time.monotonic() >= deadline:
                raise EntrypointError(
                    f"gave up after {timeout_s:g}s waiting for the lock {lock} (held by {read_holder(fd)})", hint
                )
            time.sleep(LOCK_POLL_S)


@contextmanager
def locked(path: Path, timeout_s: float, log: Log, waiting: str, hint: str, output: str | None = None) -> Iterator[int]:
    """The exclusive lock of `path` (created with its parent when missing); yields the descriptor."""
    shared_dir(path.parent)
    lock = lock_path(path)
    fd = open_lock(lock)
    try:
        wait_for(fd, lock, timeout_s, log, waiting, hint, output=output)
        write_holder(fd)
        yield fd
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


# --- building, replacing, cleaning up ---------------------------------------------------------------------------


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath, name))
        _fsync(Path(dirpath), directory=True)


def discard(path: Path, log: Log, reason: str) -> None:
    """Remove a copy we published (caller holds its lock): renamed aside first, so a crash leaves only leftovers."""
    log.info("removing a copy published earlier", path=str(path), reason=reason)
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
    try:
        os.rename(path, aside / "copy")
    except PermissionError:
        os.rmdir(aside)
        raise EntrypointError(
            f"the invalid copy {path} belongs to another user and cannot be replaced",
            "remove it, or give each UID its own CACHE_DIR",
        ) from None
    shutil.rmtree(aside, ignore_errors=True)


def _leftovers(root: Path, only: str | None) -> Iterator[tuple[Path, str]]:
    if root.is_dir():
        for path in sorted(root.iterdir()):
            match = _LEFTOVER.fullmatch(path.name)
            if match and only in (None, match["name"]):
                yield path, match["name"]


def remove_leftovers(path: Path, log: Log) -> None:
    """The leftovers of killed runs beside `path`; the caller holds its lock, so nobody else is writing them."""
    for leftover, _ in _leftovers(path.parent, path.name):
        log.warn("removing the leftovers of an interrupted run", path=str(leftover))
        shutil.rmtree(leftover, ignore_errors=True)


def sweep(root: Path, log: Log, only: str | None = None) -> None:
    """Remove the leftovers in `root` (of the name `only`, when given) whose lock is free: their writer died."""
    for leftover, name in _leftovers(root, only):
        fd = open_lock(root / f".{name}.lock")
        try:
            if try_flock(fd):
                log.warn("removing the leftovers of an interrupted run", path=str(leftover))
                shutil.rmtree(leftover, ignore_errors=True)
        finally:
            os.close(fd)


def publish(
    path: Path,
    fill: Callable[[Path], Mapping[str, object] | None],
    stamp: Mapping[str, object],
    stamp_name: str,
    log: Log,
    *,
    on_failure: Callable[[Path, BaseException], None] | None = None,
) -> Path:
    """Build `path` with `fill(tmp_dir)` (which may return more stamp values), stamp it, fsync it and rename it into
    place; the caller holds its lock. An existing `path` is replaced only when it carries our stamp or is empty."""
    if path.exists() and not is_ours(path, stamp_name) and not is_empty_dir(path):
        raise UsageError(
            f"refusing to replace {path}: it is not empty and was not written by trtllm-entrypoint",
            "point the variable at an empty or absent directory; nothing was changed",
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.new-", dir=path.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide it from replicas under other UIDs
        extra = fill(tmp) or {}
        record = {
            **stamp,
            **extra,
            "publisher": "trtllm-entrypoint",
            "created": utc_now(),
            "files": manifest(tmp, stamp_name),
            "dirs": directories(tmp),
        }
        (tmp / stamp_name).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")  # last: marks completion
        trust.restrict_writes(tmp)  # only this UID may change it: what replicas of other UIDs require
        fsync_tree(tmp)
        if path.exists() and not is_empty_dir(path):
            discard(path, log, "replaced by a new copy")
        os.rename(tmp, path)  # over an empty directory too
        _fsync(path.parent, directory=True)
    except BaseException as error:
        if on_failure is not None:
            on_failure(tmp, error)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
