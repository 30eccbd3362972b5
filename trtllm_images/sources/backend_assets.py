"""The backend's model templates, tools and TensorRT-LLM examples for base images that lack /app (NGC < 25.01).

Result: a directory in the /app layout (all_models/{inflight_batcher_llm,llmapi}, tools/, examples/), assembled
from a local checkout (--backend-dir) or from the GitHub sources at the matrix refs, which `upstream` pins in
upstream.lock.json by commit and content digest, and verifies. Published by rename, so an interrupted run never
leaves a tree that looks complete.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images.atomic import publish_dir
from trtllm_images.sources import archive as safe_archive
from trtllm_images.sources import cache as source_cache
from trtllm_images.sources import upstream

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix, MatrixEntry

TRTLLM_REPO = "NVIDIA/TensorRT-LLM"
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


def lock_paths(matrix: Matrix) -> dict[tuple[str, str], list[str]]:
    """(repo, ref) -> paths of every source upstream.lock.json must pin: what build.py takes for tags without /app,
    and the backend's own parts at every other matrix ref (its templates, for the tests). Pure."""
    wanted: dict[tuple[str, str], list[str]] = {}
    for entry in matrix.entries:
        parts = archives(entry)
        for archive in parts[:1] if entry.backend.in_image else parts:
            wanted.setdefault((archive.repo, archive.ref), []).extend(archive.members)
    return wanted


def fetch(
    entry: MatrixEntry,
    cache_dir: Path,
    local_dir: Path | None,
    log: Callable[[str], None],
    *,
    lock: upstream.Lock | None = None,
    require_pinned: bool = False,
) -> Path:
    """The app dir for `entry`: copied from `local_dir`, or from the lock's sources, verified by content."""
    root = Path(cache_dir) / "backend" / entry.backend.repo
    if local_dir is not None:
        log(f"backend assets for {entry.tag}: copying from {local_dir}")
        return publish_dir(
            root / "local" / entry.backend.ref,
            _complete(lambda tmp: _copy_local(Path(local_dir), local_members(entry), tmp, entry)),
            replace=True,
        )
    lock = lock or upstream.load_lock()
    submodule = "" if entry.backend.subdir else ", with its tensorrt_llm submodule"
    local_copy = f"--backend-dir DIR (a checkout of {entry.backend.repo} at {entry.backend.ref}{submodule})"
    parts = [(archive, lock.pin(archive.repo, archive.ref)) for archive in archives(entry)]
    trees = []
    for archive, pin in parts:
        upstream.covering(pin, archive.members)
        trees.append(source_cache.source(pin, cache_dir, local_copy=local_copy, log=log, require_pinned=require_pinned))
    # Named after the sources, whose directory names are their digests: a changed source never reuses an old app dir.
    key = hashlib.sha256("".join(tree.name for tree in trees).encode()).hexdigest()[:16]
    final = root / f"{entry.backend.ref}-{key}"
    if final.is_dir():
        log(f"backend assets for {entry.tag}: cached in {final}")
        return final

    def copy_all(tmp: Path) -> None:
        for (archive, pin), tree in zip(parts, trees, strict=True):
            safe_archive.copy_members(tree, archive.members, tmp, pin.name, log)

    return publish_dir(final, _complete(copy_all))


def _complete(fill: Callable[[Path], None]) -> Callable[[Path], None]:
    """`fill`, then a check that the app dir has everything the Dockerfiles copy."""

    def fill_and_check(tmp: Path) -> None:
        fill(tmp)
        missing = [path for path in REQUIRED if not (tmp / path).is_dir()]
        if missing:
            raise Error(
                f"backend assets lack {', '.join(missing)}",
                "check the ref in matrix.yaml, or that --backend-dir is a full checkout "
                "(layout A needs `git submodule update --init tensorrt_llm`)",
            )

    return fill_and_check


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
