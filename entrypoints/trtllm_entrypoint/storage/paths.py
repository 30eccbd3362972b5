"""Path rules every step shares: what lies under KServe's read-only model mount, cache directories that any UID can
use (replicas of different users may share one cache volume), and this process's private state under TMPDIR.

TMPDIR may be shared and sticky (/tmp): another UID can create any name there first, a symbolic link included. So
nothing of ours lives at a fixed name there: state (the health URL, the group's ssh key) goes into a directory made
by mkdtemp (`trtllm-entrypoint-<uid>-<random>`, mode 0700, created new, so never another's and never a link), and
`health` reads only such directories that this UID owns and no one else may enter.
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trtllm_entrypoint import contract


@dataclass(frozen=True)
class CacheLayout:
    """The directories under CACHE_DIR, each named once: what every step that reads or writes the cache uses."""

    root: Path

    @property
    def engines(self) -> Path:
        return self.root / "engines"  # one directory per cache key (engine/cache.py)

    @property
    def repositories(self) -> Path:
        return self.root / "repositories"  # filled repositories named by their content (repository/write.py)

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def hub(self) -> Path:
        return self.models / "hub"  # the Hugging Face client's own cache of fetched models (model/hub.py)

    @property
    def tokenizer_info(self) -> Path:
        return self.root / "tokenizer-info"  # guided decoding's tokenizer-info files (repository/xgrammar_info.py)

    @property
    def digests(self) -> Path:
        return self.root / "digests"  # the content digests of local models, per UID (model/digest.py)

    def published(self) -> tuple[Path, ...]:
        """What holds only what we published and then only read: a model or engine below them is fine as input."""
        return (self.engines, self.models)


def within(path: Path, parent: Path) -> bool:
    path, parent = Path(os.path.abspath(path)), Path(os.path.abspath(parent))
    return path == parent or parent in path.parents


def under_model_dir(path: Path) -> bool:
    """KServe mounts the model here read-only: nothing of ours is ever written below it."""
    return within(path, Path(contract.KSERVE_MODEL_DIR))


def shared_dir(path: Path) -> Path:
    """mkdir -p with mode 1777 for what we create (like /tmp), so a replica under another UID can use it too."""
    missing = []
    current = Path(os.path.abspath(path))
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue  # another replica made it first
        with contextlib.suppress(OSError):  # some volume drivers refuse modes; the directory still works for this UID
            os.chmod(directory, 0o1777)
    return path


def open_lock(path: Path) -> int:
    """A descriptor to flock on, also when another UID created the lock file (flock works read-only too)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)


def state_prefix() -> str:
    return f"trtllm-entrypoint-{os.geteuid()}-"


@functools.cache
def state_dir() -> Path:
    """This process's private directory under TMPDIR (made on first use)."""
    return Path(tempfile.mkdtemp(prefix=state_prefix()))


def is_private(path: Path, *, directory: bool) -> bool:
    """`path` itself (not a link) is a directory (or regular file) of this UID that no other UID may change (nor
    enter, for a directory)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    closed = 0o077 if directory else 0o022
    return kind and st.st_uid == os.geteuid() and not st.st_mode & closed


def state_dirs() -> Iterator[Path]:
    """The private state directories of this UID's earlier starts, newest first (another UID's are skipped)."""
    root = Path(tempfile.gettempdir())
    try:
        found = [p for p in root.iterdir() if p.name.startswith(state_prefix()) and is_private(p, directory=True)]
    except OSError:
        return iter(())
    return iter(sorted(found, key=lambda p: os.lstat(p).st_mtime, reverse=True))


def private_file(directory: Path, name: str, limit: int = 64 * 1024) -> str | None:
    """The text of `directory/name` when the directory and the file are this UID's alone (never through a link)."""
    path = directory / name
    if not (is_private(directory, directory=True) and is_private(path, directory=False)):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def write_private(directory: Path, name: str, text: str) -> Path:
    """Write `directory/name` (a private directory) atomically: a new file renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, directory / name)
    return directory / name
