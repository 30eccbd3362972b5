"""Writing a file or a directory so that readers see the old content or the new one, never half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """A temp file beside `path`, then rename: an interrupted run leaves no truncated file behind. The file gets
    `mode` (mkstemp's 0600 would leave manifests and reports unreadable to the group that applies or reads them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def publish_dir(final: Path, fill: Callable[[Path], None], *, replace: bool = False) -> Path:
    """Fill a temp dir beside `final`, then rename it into place: readers see all of it or nothing. Without `replace`
    a directory that another process published first is kept (same inputs, same content)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        fill(tmp)
        if replace and final.exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
