"""Two path rules every step shares: what lies under KServe's read-only model mount, and cache directories that any
UID can use (replicas of different users may share one cache volume)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from trtllm_entrypoint import contract


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
