"""The content digest of a local model directory: what the engine cache key records about a checkpoint on disk.

Every file's bytes count (SHA-256), so two models that differ anywhere get different keys, on read-only mounts too.
Hashing 20 GB at every start would cost minutes, so a file's digest is kept in a memo and reused only while the file
is provably unchanged: the same device, inode, size, mtime and ctime as when it was hashed. The kernel sets ctime
on every write, truncate, rename, chmod and utime, and no unprivileged call sets it back, so an owner who rewrites
bytes in place (same inode) and restores the mtime still changes the ctime. Not covered: a writer who changes the
system clock or the block device underneath the file system, and file systems that do not keep ctime.

The memo lives under CACHE_DIR/digests, one file per model path and UID, and is trusted only when this UID (or
root) owns it and nobody else may write it: another UID on a shared cache cannot plant digests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.storage.paths import shared_dir

CHUNK = 8 << 20
MEMO_SCHEMA = 1


def _state(st: os.stat_result) -> list[int]:
    """What must be unchanged for a digest to be reused."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def model_files(root: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of each file, sorted; hidden files and directories (download metadata such as
    .cache/huggingface) are not the model. Symbolic links are followed, as the hub cache's snapshots need."""
    found = []
    for directory, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith("."):
                path = Path(directory, name)
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def _hash(path: Path, before: list[int]) -> str:
    """SHA-256 of a regular file that stays as `before` describes it while it is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO swapped in must not block
    try:
        if _state(os.fstat(fd)) != before:
            raise UsageError(f"{path} changed while the model was read", "start again once the model is in place")
        digest = hashlib.sha256()
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
        if _state(os.fstat(fd)) != before:
            raise UsageError(f"{path} changed while the model was read", "start again once the model is in place")
    finally:
        os.close(fd)
    return digest.hexdigest()


def _memo_path(memo_dir: Path, root: Path) -> Path:
    name = hashlib.sha256(str(root).encode()).hexdigest()[:20]
    return memo_dir / f"{name}.uid{os.geteuid()}.json"


def _trusted(fd: int) -> bool:
    st = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and st.st_uid in (os.geteuid(), 0) and not st.st_mode & 0o022


def load_memo(memo_dir: Path, root: Path) -> dict[str, list[Any]]:
    """relative name -> state + [sha256], for `root`; empty when absent, unreadable or not trusted."""
    try:
        fd = os.open(_memo_path(memo_dir, root), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        if not _trusted(fd):
            return {}
        with os.fdopen(os.dup(fd), "rb") as handle:
            memo = json.loads(handle.read())
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(memo, dict) or memo.get("schema") != MEMO_SCHEMA or memo.get("root") != str(root):
        return {}
    files = memo.get("files")
    return files if isinstance(files, dict) else {}


def save_memo(memo_dir: Path, root: Path, files: dict[str, list[Any]]) -> None:
    """Written whole and renamed into place, readable only as this UID's; a cache that cannot take it only costs
    the next start a full read."""
    with contextlib.suppress(OSError):
        shared_dir(memo_dir)
        fd, tmp = tempfile.mkstemp(prefix=".digest-", dir=memo_dir)  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"schema": MEMO_SCHEMA, "root": str(root), "files": files}, handle)
            os.replace(tmp, _memo_path(memo_dir, root))
        except OSError:
            os.unlink(tmp)
            raise


def content_digest(root: Path, memo_dir: Path | None) -> str:
    """SHA-256 over each file's relative name, size and content digest; digests of unchanged files come from the
    memo. A FIFO, device or socket in the model is refused (reading it would block or never end)."""
    root = Path(os.path.abspath(root))
    memo = load_memo(memo_dir, root) if memo_dir is not None else {}
    fresh: dict[str, list[Any]] = {}
    for relative, path in model_files(root):
        try:
            st = os.stat(path)
        except OSError as exc:
            raise UsageError(f"{path} cannot be read: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not allowed in a model directory: expected regular files only")
        state = _state(st)
        known = memo.get(relative)
        reuse = isinstance(known, list) and known[:-1] == state and isinstance(known[-1], str)
        fresh[relative] = state + [known[-1] if reuse and known else _hash(path, state)]
    if memo_dir is not None and fresh != memo:
        save_memo(memo_dir, root, fresh)
    digest = hashlib.sha256()
    for relative, record in sorted(fresh.items()):
        digest.update(f"{relative}\0{record[2]}\0{record[-1]}\n".encode())
    return digest.hexdigest()
