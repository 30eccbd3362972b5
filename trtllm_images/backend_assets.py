"""The backend's model templates, tools and TensorRT-LLM examples for base images that lack /app (NGC < 25.01).

Result: a directory in the /app layout (all_models/{inflight_batcher_llm,llmapi}, tools/, examples/), assembled
from a local checkout (--backend-dir) or from GitHub tarballs at the matrix refs. Downloads are cached under
<cache_dir>/backend/<repo>/<ref>, published by rename so an interrupted download never looks complete.
"""

from __future__ import annotations

import posixpath
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, cast

from trtllm_images.errors import BuildError, UsageError

if TYPE_CHECKING:
    from trtllm_images.matrix import MatrixEntry

TARBALL_URL = "https://codeload.github.com/{repo}/tar.gz/{ref}"
TRTLLM_REPO = "NVIDIA/TensorRT-LLM"
TIMEOUT_SECS = 60  # per socket operation; the body is streamed
REQUIRED = ("all_models/inflight_batcher_llm", "tools", "examples")
_MODELS = ("inflight_batcher_llm", "llmapi")


@dataclass(frozen=True)
class Archive:
    repo: str
    ref: str
    members: Mapping[str, str]  # path in the repository -> path in the app dir


def archives(entry: MatrixEntry) -> tuple[Archive, ...]:
    """Where each part of the app dir comes from on GitHub. Pure."""
    backend = entry.backend
    members = _backend_members(backend.subdir)
    if backend.subdir:  # layout B: the backend lives inside TensorRT-LLM, next to its examples
        return (Archive(backend.repo, backend.ref, {**members, "examples": "examples"}),)
    # Layout A: examples are in the tensorrt_llm submodule, which GitHub tarballs leave empty.
    return (
        Archive(backend.repo, backend.ref, members),
        Archive(TRTLLM_REPO, f"v{entry.tensorrt_llm}", {"examples": "examples"}),
    )


def local_members(entry: MatrixEntry) -> dict[str, str]:
    """Path in a local checkout of entry.backend.repo -> path in the app dir. Pure."""
    subdir = entry.backend.subdir
    return {**_backend_members(subdir), ("examples" if subdir else "tensorrt_llm/examples"): "examples"}


def _backend_members(subdir: str) -> dict[str, str]:
    prefix = f"{subdir}/" if subdir else ""
    members = {f"{prefix}all_models/{model}": f"all_models/{model}" for model in _MODELS}
    members[f"{prefix}tools"] = "tools"
    return members


def fetch(entry: MatrixEntry, cache_dir: Path, local_dir: Path | None, log: Callable[[str], None]) -> Path:
    root = Path(cache_dir) / "backend" / entry.backend.repo
    if local_dir is not None:
        log(f"backend assets for {entry.tag}: copying from {local_dir}")
        return _publish(
            lambda tmp: _copy_local(Path(local_dir), local_members(entry), tmp, entry),
            root / "local" / entry.backend.ref,
            replace=True,
        )
    final = root / entry.backend.ref
    if final.is_dir():
        log(f"backend assets for {entry.tag}: cached in {final}")
        return final

    def download_all(tmp: Path) -> None:
        for archive in archives(entry):
            _download(archive, tmp, log)

    return _publish(download_all, final, replace=False)


def _publish(fill: Callable[[Path], None], final: Path, *, replace: bool) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        fill(tmp)
        missing = [path for path in REQUIRED if not (tmp / path).is_dir()]
        if missing:
            raise BuildError(
                f"backend assets lack {', '.join(missing)}",
                "check the ref in matrix.yaml, or that --backend-dir is a full checkout "
                "(layout A needs `git submodule update --init tensorrt_llm`)",
            )
        if replace and final.exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # otherwise another build published the same ref first: use theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _copy_local(local_dir: Path, members: dict[str, str], dest: Path, entry: MatrixEntry) -> None:
    if not local_dir.is_dir():
        raise UsageError(
            f"--backend-dir {local_dir} is not a directory",
            f"pass a checkout of {entry.backend.repo} at {entry.backend.ref}",
        )
    for source, target in members.items():
        if (local_dir / source).is_dir():
            shutil.copytree(
                local_dir / source,
                dest / target,
                ignore_dangling_symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"),
            )


def _open_url(url: str):
    """The HTTP GET; a seam for tests, which hand back a local tarball instead."""
    return urllib.request.urlopen(url, timeout=TIMEOUT_SECS)


def _download(archive: Archive, dest: Path, log: Callable[[str], None]) -> None:
    url = TARBALL_URL.format(repo=archive.repo, ref=archive.ref)
    hint = (
        f"pass --backend-dir DIR with a local checkout of {archive.repo} at {archive.ref} "
        "(for tensorrtllm_backend, including its tensorrt_llm submodule)"
    )
    log(f"downloading {url}")
    try:
        with _open_url(url) as response, tarfile.open(fileobj=response, mode="r|gz") as tar:
            for member in tar:
                _extract(tar, member, archive.members, dest)
    except urllib.error.HTTPError as exc:
        raise BuildError(f"cannot download {url}: HTTP {exc.code} ({exc.reason})", hint) from None
    except (urllib.error.URLError, OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise BuildError(f"cannot download {url}: {getattr(exc, 'reason', exc)}", hint) from None


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, members: Mapping[str, str], dest: Path) -> None:
    parts = PurePosixPath(member.name).parts[1:]  # drop GitHub's "<name>-<ref>/" top directory
    if not parts or ".." in parts or member.name.startswith("/"):
        return
    rel = "/".join(parts)
    source = next((s for s in members if rel == s or rel.startswith(s + "/")), None)
    if source is None:
        return
    target = dest / (members[source] + rel[len(source) :])
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
    elif member.isfile():
        target.parent.mkdir(parents=True, exist_ok=True)
        # A regular member always has data (extractfile returns None only for other kinds).
        with cast("IO[bytes]", tar.extractfile(member)) as data, open(target, "wb") as out:
            shutil.copyfileobj(data, out)
        target.chmod(0o755 if member.mode & 0o111 else 0o644)
    elif member.issym() and _link_stays_inside(rel, member.linkname, source):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(member.linkname)
    # Hard links, devices and symlinks leaving the kept tree are skipped: nothing we need, and not safe.


def _link_stays_inside(rel: str, linkname: str, root: str) -> bool:
    if posixpath.isabs(linkname):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), linkname))
    return resolved == root or resolved.startswith(root + "/")
