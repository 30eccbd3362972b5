"""Whether another UID could change what we are about to serve from a shared cache, between our check and the
server's load.

A cached engine or repository is served as it is only when it, and everything in it, belongs to this UID or root,
no one else may write any of it, and it holds no symbolic link. Everything we publish is made so (`restrict_writes`),
whatever the umask or the volume's group bits (KServe's fsGroup, the arbitrary-UID pattern with GID 0). What another
UID published is copied into a private copy first (see engine_cache and repository). The directories above the
cache must let no one else rename what is inside them (owned by this UID or root and not writable by others, or
sticky like /tmp); `open_ancestors` names the ones that do, for a warning.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from trtllm_entrypoint.storage.paths import state_dir

OTHERS_WRITE = 0o022  # group and others


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0)


def untrusted(path: Path) -> str | None:
    """Why another UID could change the tree at `path` (not following links), or None when none could."""
    for directory, dirs, files in os.walk(path):
        for name in (None, *dirs, *files):
            item = Path(directory, name) if name else Path(directory)
            st = os.lstat(item)
            if stat.S_ISLNK(st.st_mode):
                return f"{item} is a symbolic link"
            if not _trusted_owner(st):
                return f"{item} belongs to UID {st.st_uid}"
            if st.st_mode & OTHERS_WRITE:
                return f"{item} is writable by its group or others"
    return None


def renamable(directory: Path) -> str | None:
    """Why another UID could rename or replace the entries of `directory` (an entry served from it could be moved
    away after the check), or None: it is a link, belongs to another UID (a directory's owner may rename in it even
    when it is sticky), or its group or others may write it without the sticky bit."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None  # made by us when needed (shared_dir makes it sticky)
    if stat.S_ISLNK(st.st_mode):
        return f"{directory} is a symbolic link"
    if not _trusted_owner(st):
        return f"{directory} belongs to UID {st.st_uid}, which may move what is in it"
    if st.st_mode & OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        return f"{directory} is writable by its group or others and not sticky"
    return None


def private_root(root: Path) -> Path:
    """A directory for this UID's own copies (repositories, engines) in which no other UID may rename entries:
    `<root>.uid<UID>` beside `root` when its parent allows that, else one in this process's private state directory
    (paths.state_dir)."""
    mine = root.with_name(f"{root.name}.uid{os.geteuid()}")
    if renamable(mine.parent) is None:
        with contextlib.suppress(FileExistsError):
            mine.mkdir(mode=0o755)
        if renamable(mine) is None and mine.is_dir():
            return mine
    fallback = state_dir() / root.name
    fallback.mkdir(exist_ok=True)
    return fallback


def restrict_writes(root: Path) -> None:
    """Drop group and other write permission on everything under `root` (read and search stay for all)."""
    for directory, dirs, files in os.walk(root):
        for name in (None, *dirs, *files):
            item = Path(directory, name) if name else Path(directory)
            st = os.lstat(item)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & OTHERS_WRITE:
                os.chmod(item, stat.S_IMODE(st.st_mode) & ~OTHERS_WRITE)


def open_ancestors(path: Path) -> list[Path]:
    """The directories above `path` (itself included) in which another UID could rename an entry: writable by group
    or others, or owned by another UID, and not sticky."""
    found = []
    for directory in (Path(os.path.abspath(path)), *Path(os.path.abspath(path)).parents):
        try:
            st = os.stat(directory)
        except OSError:
            continue  # not created yet: shared_dir makes what we create sticky
        writable_by_others = st.st_mode & OTHERS_WRITE or not _trusted_owner(st)
        if writable_by_others and not st.st_mode & stat.S_ISVTX:
            found.append(directory)
    return found
