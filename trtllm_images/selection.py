"""Turning the build commands' options into plans: the matrix loaded and every selected tag planned, so that any bad
tag or option fails before any work. Pure apart from reading the matrix file; cli.py declares the options."""

from __future__ import annotations

from pathlib import Path

from trtllm_entrypoint.errors import UsageError
from trtllm_images import matrix as matrix_mod
from trtllm_images.plan import BuildPlan, make_build_plan

DEFAULT_OUT = Path("out")


def select_plans(
    matrix_path: Path,
    tags: tuple[str, ...],
    all_tags: bool,
    *,
    base_image: str | None = None,
    registry: str | None = None,
    out_dir: Path = DEFAULT_OUT,
    revision: str | None = None,
    multinode: bool = False,
) -> tuple[matrix_mod.Matrix, list[BuildPlan]]:
    """Load the matrix and plan every selected tag; any bad tag or option fails here, before any work."""
    if tags and all_tags:
        raise UsageError("--tag and --all exclude each other", "give one or more --tag TAG, or --all")
    matrix = matrix_mod.load(matrix_path)
    if not tags and not all_tags:
        raise UsageError(
            "no tag selected",
            f"give --tag TAG (repeatable) or --all; known tags: {', '.join(e.tag for e in matrix.supported())}",
        )
    entries = matrix.supported() if all_tags else [matrix.get(tag) for tag in dict.fromkeys(tags)]
    if base_image and len(entries) != 1:
        raise UsageError(
            f"--base-image applies to a single tag, got {len(entries)} tags",
            "build the tags one by one, each with its own --base-image",
        )
    return matrix, [
        make_build_plan(
            e, base_image=base_image, registry=registry, out_dir=out_dir, revision=revision, multinode=multinode
        )
        for e in entries
    ]
