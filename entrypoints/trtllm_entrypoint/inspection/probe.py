"""What is installed in this image, as a JSON-able dict; build.py compares it with the matrix entry.

Versions come from the install itself, never from the matrix, so that a wrong entry shows up as a difference.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.image_facts import Installation, installed_tensorrt, installed_version
from trtllm_entrypoint.launch import group

TRITON_VERSION_FILE = "/opt/tritonserver/TRITON_VERSION"


def _triton_version(given: str | None) -> str | None:
    if given:
        return given
    try:
        return Path(TRITON_VERSION_FILE).read_text().strip() or None
    except OSError:
        return None


def _existing(path: str) -> str | None:
    return path if os.path.isfile(path) else None


def probe(where: Installation) -> dict[str, object]:
    app = where.app_dir
    templates = app / "all_models"
    return {
        "tag": where.tag,
        "tensorrt_llm": installed_version("tensorrt_llm"),
        "tensorrt": installed_tensorrt(),
        "triton": _triton_version(where.triton_version),
        "python": platform.python_version(),
        "app_dir": str(app),
        "templates": {name: (templates / name).is_dir() for name in ("inflight_batcher_llm", "llmapi")},
        "fill_template": (app / "tools" / "fill_template.py").is_file(),
        # Found the way launch and the engine build will look for them: a fixed path, or PATH.
        "programs": {
            "tritonserver": _existing(contract.TRITONSERVER),
            "trtllm-build": shutil.which("trtllm-build", path=where.search_path),
            "mpirun": shutil.which("mpirun", path=where.search_path),
            # Multi-node groups start their ranks over ssh: the group image has both (build.py --multinode).
            "ssh": shutil.which("ssh", path=where.search_path),
            "sshd": _existing(group.SSHD),
        },
        "openai_frontend": os.path.isfile(contract.OPENAI_FRONTEND_MAIN),
        "huggingface_hub": installed_version("huggingface_hub"),
    }
