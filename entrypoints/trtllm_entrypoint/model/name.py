"""The model's own name, which OpenAI clients send as `model` (vLLM and NIM serve under it): SERVED_MODEL_NAME when
set; else MODEL_ID as given for a Hugging Face id; else the model directory's name (a Hugging Face cache snapshot
gives back its id). Under KServe the runtime passes the InferenceService's name as SERVED_MODEL_NAME, as KServe's
own runtimes do: the directory there is always /mnt/models, whose name says nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtllm_entrypoint.model.locate import ModelSource

HUB_CACHE_PREFIX = "models--"  # huggingface_hub's cache: <cache>/models--<org>--<name>/snapshots/<commit>/


def own_name(source: ModelSource) -> str:
    """MODEL_ID's hub id, or the name of the model's directory."""
    if source.repo_id is not None:
        return source.repo_id
    if source.path is None:
        raise ValueError("a model source has a hub id or a path")
    path = Path(source.path)
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith(HUB_CACHE_PREFIX) and repo != HUB_CACHE_PREFIX:
        return repo.removeprefix(HUB_CACHE_PREFIX).replace("--", "/", 1)
    return path.name


def served_name(served_model_name: str | None, source: ModelSource) -> str:
    return served_model_name or own_name(source)
