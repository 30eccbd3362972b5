"""Write a Docker build context for a plan: all or nothing.

The context is assembled in a temporary directory beside plan.context_dir and swapped in by rename, so an
interrupted or failed write never leaves a half-written context that a later build would pick up.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
from pathlib import Path

from trtllm_entrypoint.errors import Error
from trtllm_images.plan import BuildPlan
from trtllm_images.wheel import WHEEL_GLOB

BUNDLED_APP = Path("backend") / "app"
# The OpenAI front's libraries: pure ones, and compiled ones per Python (the image's own Python picks its set at start).
FRONT_DIRS = ("front/any", "front/py3.10", "front/py3.12")
VENDOR_FILES = (
    "bin/tini",
    "validation/model_config_pb2.py",
)  # what the Dockerfiles COPY from vendor/  # the Dockerfiles COPY this into the image's bundled app dir


def write_context(
    plan: BuildPlan,
    dockerfiles: dict[str, str],
    wheel: Path,
    matrix_json: str,
    assets: Path | None,
    models_json: str,
    vendor_dir: Path,
) -> Path:
    """`matrix_json` and `models_json`: capabilities.image_matrix_json() and model_support.models_json(); `vendor_dir`:
    vendor.assemble()'s output (tini and the repository check's validation kit)."""
    _validate(plan, dockerfiles, Path(wheel), matrix_json, assets)
    missing = [name for name in VENDOR_FILES if not (Path(vendor_dir) / name).is_file()]
    missing += [name for name in FRONT_DIRS if not (Path(vendor_dir) / name).is_dir()]
    if missing:
        raise Error(f"{vendor_dir} lacks {', '.join(missing)}", "assemble it with vendor.assemble()")
    target = plan.context_dir
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        for name, text in sorted(dockerfiles.items()):
            (tmp / name).write_text(text, encoding="utf-8", newline="\n")
        (tmp / "matrix.json").write_text(matrix_json, encoding="utf-8", newline="\n")
        (tmp / "models.json").write_text(models_json, encoding="utf-8", newline="\n")
        shutil.copytree(vendor_dir, tmp / "vendor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (tmp / "wheels").mkdir()
        shutil.copyfile(wheel, tmp / "wheels" / Path(wheel).name)
        if plan.needs_backend_assets and assets is not None:  # _validate refused needing them without them
            shutil.copytree(
                assets, tmp / BUNDLED_APP, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git")
            )
        _normalise_modes(tmp)
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _validate(plan: BuildPlan, dockerfiles: dict[str, str], wheel: Path, matrix_json: str, assets: Path | None) -> None:
    missing = [spec.dockerfile for spec in plan.images if spec.dockerfile not in dockerfiles]
    if missing:
        raise Error(f"no rendered text for {', '.join(missing)}", "pass the output of render.render_dockerfiles(plan)")
    if not wheel.is_file() or not fnmatch.fnmatch(wheel.name, WHEEL_GLOB):
        raise Error(f"{wheel} is not a {WHEEL_GLOB} file", "build it with wheel.build_wheel()")
    try:
        tags = {entry["tag"] for entry in json.loads(matrix_json)}
    except (ValueError, TypeError, KeyError):
        raise Error("the matrix JSON is not a list of entries", "pass Matrix.to_json()") from None
    if plan.entry.tag not in tags:
        # The image would start with MATRIX_TAG pointing at nothing.
        raise Error(f"the matrix JSON has no entry for tag {plan.entry.tag}", "pass Matrix.to_json()")
    if plan.needs_backend_assets:
        if assets is None or not all((Path(assets) / d).is_dir() for d in ("all_models", "tools", "examples")):
            raise Error(
                f"tag {plan.entry.tag} needs the backend's all_models/, tools/ and examples/, got {assets}",
                f"pass --backend-dir with a checkout of {plan.entry.backend.repo} at {plan.entry.backend.ref}",
            )
    elif assets is not None:
        raise Error(
            f"tag {plan.entry.tag} has /app in its base image; backend assets would be ignored",
            "drop --backend-dir for this tag",
        )


def _normalise_modes(root: Path) -> None:
    """Readable by any UID inside the image; the same modes whatever the umask, so COPY layers stay cacheable."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                os.chmod(path, 0o755 if path.stat().st_mode & 0o111 else 0o644)


def _swap_in(tmp: Path, target: Path) -> None:
    if not target.exists():
        os.replace(tmp, target)
        return
    # rename(2) cannot replace a non-empty directory: move the old one aside first, then drop it.
    old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.replace(target, old / "context")
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old / "context", target)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
