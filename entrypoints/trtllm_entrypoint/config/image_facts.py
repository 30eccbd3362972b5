"""What this image is: the matrix entry named by MATRIX_TAG, and what is actually installed.

Outside an image, MATRIX_TAG (with TRTLLM_MATRIX_FILE pointing at `python build.py list --json` output) says which
TensorRT-LLM to expect when `tensorrt_llm` is not importable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.variables import WORKFLOWS, Workflow
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.versions import version_tuple


@dataclass(frozen=True)
class ImageFacts:
    tag: str
    tensorrt_llm: str  # the version engines are built and served with
    tensorrt: str | None
    triton: str | None
    workflows: tuple[Workflow, ...]
    engine_deprecated: bool
    openai_frontend: bool
    app_dir: Path  # holds all_models/, tools/, examples/
    installed: bool = field(default=False)  # tensorrt_llm is importable (versions read from the install)
    matrix_tensorrt_llm: str = ""  # what the matrix entry says; differs from tensorrt_llm only in a broken image
    # Named capabilities of this TensorRT-LLM (capabilities.yaml, via matrix.json): code branches on these names.
    examples_layout: str = "flat"  # "flat": examples/<dir>/; "models": examples/models/{core,contrib}/<dir>/
    features: tuple[str, ...] = ()
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)  # program -> flags it takes
    models_file: Path = Path(contract.MODELS_FILE)  # the model list (`python build.py models --json`)
    # Feature -> the first supported tag of the matrix that has it: what a refusal names as the way out.
    first_tag_with: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def default_workflow(self) -> Workflow:
        return "llmapi" if self.engine_deprecated and "llmapi" in self.workflows else "engine"

    @property
    def templates_dir(self) -> Path:
        return self.app_dir / "all_models"


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# The TensorRT wheel is "tensorrt" in NGC images; pip installs name it by CUDA major.
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt_cu12", "tensorrt_cu13")


def installed_tensorrt() -> str | None:
    return next((v for v in map(installed_version, TENSORRT_DISTRIBUTIONS) if v), None)


def app_dir(environ: Mapping[str, str], in_image: bool | None) -> Path:
    """Where all_models/, tools/ and examples/ are: TRTLLM_APP_DIR, else NGC's /app when the image ships it (None:
    when it exists), else the copy build.py bakes in."""
    if environ.get("TRTLLM_APP_DIR"):
        return Path(environ["TRTLLM_APP_DIR"])
    if in_image is None:
        in_image = Path(contract.NGC_APP_DIR).is_dir()
    return Path(contract.NGC_APP_DIR if in_image else contract.BUNDLED_APP_DIR)


@dataclass(frozen=True)
class Installation:
    """What `probe` reports from the environment: it runs also where the matrix entry cannot be loaded."""

    tag: str | None
    app_dir: Path
    triton_version: str | None  # TRITON_SERVER_VERSION, which NGC's images set
    search_path: str  # PATH, where launch and the engine build look for programs


def installation(environ: Mapping[str, str], facts: ImageFacts | None) -> Installation:
    return Installation(
        tag=facts.tag if facts is not None else (environ.get("MATRIX_TAG") or None),
        app_dir=facts.app_dir if facts is not None else app_dir(environ, None),
        triton_version=environ.get("TRITON_SERVER_VERSION") or None,
        search_path=environ.get("PATH", os.defpath),
    )


def models_file(environ: Mapping[str, str]) -> Path:
    """Next to the matrix file: TRTLLM_MATRIX_FILE's directory, or the image's contract.MODELS_FILE."""
    if environ.get("TRTLLM_MATRIX_FILE"):
        return Path(environ["TRTLLM_MATRIX_FILE"]).with_name(Path(contract.MODELS_FILE).name)
    return Path(contract.MODELS_FILE)


def _load_entries(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The entry of MATRIX_TAG and every entry of the matrix file."""
    tag = environ.get("MATRIX_TAG", "")
    path = Path(environ.get("TRTLLM_MATRIX_FILE", contract.MATRIX_FILE))
    if not tag:
        raise UsageError(
            "MATRIX_TAG is not set",
            "images built by build.py set it; outside an image set MATRIX_TAG to an NGC tag such as 25.01",
        )
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"matrix file {path} does not exist",
            "set TRTLLM_MATRIX_FILE to the output of `python build.py list --json`",
        ) from None
    except ValueError as exc:
        raise UsageError(f"matrix file {path} is not valid JSON: {exc}") from None
    by_tag: dict[str, dict[str, Any]] = {e["tag"]: e for e in entries}
    if tag not in by_tag:
        raise UsageError(f"MATRIX_TAG={tag!r} is not in {path}", "known tags: " + ", ".join(sorted(by_tag)))
    return by_tag[tag], entries


def first_tags(entries: list[dict[str, Any]]) -> dict[str, str]:
    """Feature -> the first supported tag that has it (the file lists tags oldest first)."""
    first: dict[str, str] = {}
    for entry in sorted(entries, key=lambda e: version_tuple(e["tag"])):
        if entry.get("status", "supported") != "supported":
            continue
        for feature in (entry.get("capabilities") or {}).get("features", ()):
            first.setdefault(feature, entry["tag"])
    return first


def load_facts(environ: Mapping[str, str]) -> ImageFacts:
    entry, entries = _load_entries(environ)
    trtllm = installed_version("tensorrt_llm")
    capabilities = entry.get("capabilities")
    if not isinstance(capabilities, dict):
        raise UsageError(
            f"the matrix entry for {entry['tag']} has no capabilities",
            "regenerate the matrix file with `python build.py list --json`",
        )
    return ImageFacts(
        tag=entry["tag"],
        tensorrt_llm=trtllm or entry["tensorrt_llm"],
        tensorrt=installed_tensorrt() or entry["tensorrt"],
        triton=entry["triton"],
        workflows=tuple(w for w in WORKFLOWS if w in entry["workflows"]),
        engine_deprecated=bool(entry["engine_deprecated"]),
        openai_frontend=bool(entry["openai_frontend"]),
        app_dir=app_dir(environ, entry["backend"]["in_image"]),
        installed=trtllm is not None,
        matrix_tensorrt_llm=entry["tensorrt_llm"],
        examples_layout=capabilities["examples_layout"],
        features=tuple(capabilities["features"]),
        flags={program: tuple(f) for program, f in capabilities["flags"].items()},
        models_file=models_file(environ),
        first_tag_with=first_tags(entries),
    )
