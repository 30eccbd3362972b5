"""What the model is: a hub id, a local Hugging Face checkpoint, a prebuilt engine, or a complete Triton repository.

`resolve` only looks (files, names); fetching a hub model is hub.py's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trtllm_entrypoint import contract
from trtllm_entrypoint.contract import HUB_ID_RULE, is_hub_id
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model import digest as model_digest
from trtllm_entrypoint.model import files as model_files
from trtllm_entrypoint.repository import fill
from trtllm_entrypoint.storage.paths import under_model_dir

if TYPE_CHECKING:
    from trtllm_entrypoint.config.settings import Settings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
LOOKED_FOR = (
    "a prebuilt engine (config.json with build_config, and rank*.engine files)",
    "a Triton model repository (<model>/config.pbtxt with every ${...} filled in)",
    "a Hugging Face checkpoint (config.json with architectures or model_type)",
)


LocalKind = Literal["checkpoint", "engine", "repository"]
ModelKind = Literal["hub", LocalKind]  # a hub model is not downloaded yet


@dataclass(frozen=True)
class ModelSource:
    kind: ModelKind
    path: Path | None  # local path; None for a hub model not yet downloaded
    repo_id: str | None  # also kept after download()
    revision: str | None  # as asked (MODEL_REVISION); after download() the resolved commit
    read_only: bool  # True under /mnt/models and in the hub cache: never written, re-created per pod


def _json_keys(path: Path) -> set[str]:
    return set(model_files.read_json_object(path) or {})


def classify_dir(path: Path) -> LocalKind:
    """ "engine", "repository" or "checkpoint"; UsageError (listing what was looked for) otherwise."""
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory", "point MODEL_ID / ENGINE_DIR at a model directory")
    keys = _json_keys(path / "config.json")
    if "build_config" in keys and any(path.glob("rank*.engine")):
        return "engine"
    pbtxts = sorted(path.glob("*/config.pbtxt"))
    if pbtxts:
        unfilled = [p.parent.name for p in pbtxts if any(fill.unfilled(p.read_text(errors="replace")))]
        if unfilled:
            raise UsageError(
                f"{path} is a repository template: ${{...}} placeholders are left in "
                f"{', '.join(unfilled)}/config.pbtxt",
                "point MODEL_ID at the Hugging Face checkpoint instead; the entrypoint fills the templates itself",
            )
        return "repository"
    if keys & {"architectures", "model_type"}:
        return "checkpoint"
    raise UsageError(f"{path} holds no model that can be served: looked for " + "; ".join(LOOKED_FOR))


def _local(path: Path) -> ModelSource:
    path = Path(os.path.abspath(path))
    return ModelSource(kind=classify_dir(path), path=path, repo_id=None, revision=None, read_only=under_model_dir(path))


def resolve_model(settings: Settings, exists: Callable[[str], bool] = os.path.exists) -> ModelSource:
    """The model named by MODEL_ID, or /mnt/models when MODEL_ID is unset; ENGINE_DIR is not considered."""
    model_id = settings.model_id
    if model_id is None:
        if exists(contract.KSERVE_MODEL_DIR):
            return _local(Path(contract.KSERVE_MODEL_DIR))
        late = " (MODEL_INIT_MODE=async: the modelcar has not put it there yet)" if settings.model_init_async else ""
        raise UsageError(
            f"MODEL_ID is not set and {contract.KSERVE_MODEL_DIR} does not exist{late}",
            "set MODEL_ID to a Hugging Face id (org/name) or a local path, "
            f"or mount the model at {contract.KSERVE_MODEL_DIR}",
        )
    if exists(model_id):
        return _local(Path(model_id))
    if model_id.startswith(("/", "./", "../", "~")):
        raise UsageError(
            f"MODEL_ID={model_id!r} is not allowed: the path does not exist",
            "mount the model directory into the container at that path",
        )
    if is_hub_id(model_id):
        return ModelSource(kind="hub", path=None, repo_id=model_id, revision=settings.model_revision, read_only=False)
    raise UsageError(
        f"MODEL_ID={model_id!r} is not allowed: expected {HUB_ID_RULE}, or the path of an existing directory"
    )


def model_id_dir(settings: Settings) -> Path | None:
    """MODEL_ID's own directory (absolute) when it names one; beside ENGINE_DIR, where the tokenizer may live."""
    model_id = settings.model_id
    return Path(os.path.abspath(model_id)) if model_id and os.path.isdir(model_id) else None


def resolve(settings: Settings, exists: Callable[[str], bool] = os.path.exists) -> ModelSource:
    """What to serve: ENGINE_DIR when set (it must hold an engine), else the model of resolve_model()."""
    if settings.engine_dir is None:
        return resolve_model(settings, exists)
    if not exists(str(settings.engine_dir)):
        raise UsageError(f"ENGINE_DIR={str(settings.engine_dir)!r} is not allowed: the directory does not exist")
    source = _local(settings.engine_dir)
    if source.kind != "engine":
        raise UsageError(
            f"ENGINE_DIR={str(settings.engine_dir)!r} is not allowed: it holds a {source.kind}, "
            "expected a prebuilt engine (config.json with build_config, and rank*.engine files)",
            "use MODEL_ID for checkpoints and repositories",
        )
    return source


def identity(source: ModelSource, memo_dir: Path | None = None) -> dict[str, Any]:
    """What the engine cache key records about the model: repo and resolved commit, or the content digest alone
    (model_digest; `memo_dir` keeps the digests of unchanged files between starts). A local model's path is not part
    of it: the same bytes mounted elsewhere (`/models/x` under Docker, `/mnt/models` under KServe) reuse the engine."""
    if source.kind == "hub" or source.path is None:
        raise ValueError("identity() of a hub model needs download() first: the commit is resolved there")
    if source.repo_id is not None:
        return {"repo_id": source.repo_id, "revision": source.revision}
    return {"content": model_digest.content_digest(source.path, memo_dir)}
