"""Served code comes only from the image: a cached model repository is reused only when every file in it is what
this image's templates and this start's fill plan would write.

The cache volume is often shared by replicas and UIDs; whoever can write it could otherwise plant a `model.py`
that every later replica runs. Every file counts, not only `model.py` and `lib/`: Triton's Python stub puts the
model directory on `sys.path` (measured on 2.51), so an added `.py` file shadows an import, and a changed
`config.pbtxt` can name another backend or file. Bytecode is not compared but dropped before the server starts:
the stub writes `__pycache__/*.pyc` next to `model.py`, and a planted `.pyc` whose header matches the source would
run instead of it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtllm_entrypoint.repository.fill import FillPlan

BYTECODE_DIR = "__pycache__"
NOT_A_FILE = "not a regular file"  # what a symlink, device or FIFO "hashes" to: never what a plan writes


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_files(plan: FillPlan, template_root: Path) -> dict[str, str]:
    """Relative path in the repository -> sha256 of the content the plan writes there (copied, then filled)."""
    expected: dict[str, str] = {}
    for model in plan.models:
        source = Path(template_root) / model.source
        for directory, dirs, files in os.walk(source, followlinks=True):  # as repository's copy follows them
            dirs[:] = [d for d in dirs if d != BYTECODE_DIR]
            for name in files:
                path = Path(directory, name)
                expected[f"{model.name}/{path.relative_to(source).as_posix()}"] = _digest(path.read_bytes())
        for relative, text in model.files.items():
            expected[f"{model.name}/{relative}"] = _digest(text.encode())
    return expected


def actual_files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of each regular file under root; NOT_A_FILE for a symlink, device or FIFO.
    Bytecode directories are left out: drop_bytecode removes them."""
    found: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):  # does not follow symlinked directories
        for name in [d for d in dirs if os.path.islink(os.path.join(directory, d))] + files:
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            regular = stat.S_ISREG(os.lstat(path).st_mode)
            found[relative] = _digest(path.read_bytes()) if regular else NOT_A_FILE
        dirs[:] = [d for d in dirs if d != BYTECODE_DIR and not os.path.islink(os.path.join(directory, d))]
    return found


def differences(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """The relative paths that differ: changed, missing or added; sorted."""
    return sorted(path for path in expected.keys() | actual.keys() if expected.get(path) != actual.get(path))


def changed_files(plan: FillPlan, template_root: Path, root: Path, ignore: tuple[str, ...] = ()) -> list[str]:
    """What differs between `root` and what the plan writes; `ignore`: our own bookkeeping files (the stamp)."""
    actual = {path: digest for path, digest in actual_files(root).items() if path not in ignore}
    return differences(expected_files(plan, template_root), actual)


def drop_bytecode(root: Path) -> None:
    """Remove every __pycache__ under root, so the server compiles the checked sources anew."""
    for directory, dirs, _ in os.walk(root):
        for name in [d for d in dirs if d == BYTECODE_DIR]:
            shutil.rmtree(Path(directory, name), ignore_errors=True)
        dirs[:] = [d for d in dirs if d != BYTECODE_DIR]
