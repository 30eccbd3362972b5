"""What is installed in this image, as a JSON-able dict; build.py compares it with the matrix entry.

Versions come from the install itself, never from the matrix, so that a wrong entry shows up as a difference.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Mapping

from trtllm_entrypoint import contract
from trtllm_entrypoint.facts import ImageFacts, installed_version

TRITON_VERSION_FILE = "/opt/tritonserver/TRITON_VERSION"
HPCX_MPIRUN = "/opt/hpcx/ompi/bin/mpirun"
# The TensorRT wheel is "tensorrt" in NGC images; pip installs name it by CUDA major.
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt_cu12", "tensorrt_cu13")


def _app_dir(facts: ImageFacts | None, environ: Mapping[str, str]) -> Path:
    if facts is not None:
        return facts.app_dir
    if environ.get("TRTLLM_APP_DIR"):
        return Path(environ["TRTLLM_APP_DIR"])
    return Path(contract.NGC_APP_DIR if os.path.isdir(contract.NGC_APP_DIR) else contract.BUNDLED_APP_DIR)


def _triton_version(environ: Mapping[str, str]) -> str | None:
    if environ.get("TRITON_SERVER_VERSION"):
        return environ["TRITON_SERVER_VERSION"]
    try:
        return Path(TRITON_VERSION_FILE).read_text().strip() or None
    except OSError:
        return None


def _which(name: str, environ: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=environ.get("PATH", os.defpath))


def _existing(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def _tensorrt_version() -> str | None:
    return next((v for v in map(installed_version, TENSORRT_DISTRIBUTIONS) if v), None)


def probe(facts: ImageFacts | None, environ: Mapping[str, str]) -> dict:
    app_dir = _app_dir(facts, environ)
    templates = app_dir / "all_models"
    return {
        "tag": facts.tag if facts is not None else (environ.get("MATRIX_TAG") or None),
        "tensorrt_llm": installed_version("tensorrt_llm"),
        "tensorrt": _tensorrt_version(),
        "triton": _triton_version(environ),
        "python": platform.python_version(),
        "app_dir": str(app_dir),
        "templates": {name: (templates / name).is_dir() for name in ("inflight_batcher_llm", "llmapi")},
        "fill_template": (app_dir / "tools" / "fill_template.py").is_file(),
        "programs": {
            "tritonserver": _existing(contract.TRITONSERVER) or _which("tritonserver", environ),
            "trtllm-build": _which("trtllm-build", environ),
            # HPC-X keeps mpirun here in images that do not put it on PATH.
            "mpirun": _which("mpirun", environ) or _existing(HPCX_MPIRUN),
        },
        "openai_frontend": os.path.isfile(contract.OPENAI_FRONTEND_MAIN),
        "huggingface_hub": installed_version("huggingface_hub"),
    }
