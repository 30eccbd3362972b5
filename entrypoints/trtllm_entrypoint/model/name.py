"""The model's own name, which OpenAI clients send as `model` (vLLM and NIM serve under it): SERVED_MODEL_NAME when
set; else MODEL_ID as given when it is a Hugging Face id; else the name of the model's directory (MODEL_ID's, or
ENGINE_DIR's when only an engine is given); a Hugging Face cache snapshot gives back its id.

Under KServe the runtime passes the InferenceService's name as SERVED_MODEL_NAME, as KServe's own runtimes do: the
model's directory there is always /mnt/models, whose name says nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint.contract import is_hub_id

if TYPE_CHECKING:
    from trtllm_entrypoint.model.locate import ModelSource

HUB_CACHE_PREFIX = "models--"  # huggingface_hub's cache: <cache>/models--<org>--<name>/snapshots/<commit>/


def directory_name(path: Path) -> str:
    """A directory's name; a hub cache snapshot's repository id."""
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith(HUB_CACHE_PREFIX) and repo != HUB_CACHE_PREFIX:
        return repo.removeprefix(HUB_CACHE_PREFIX).replace("--", "/", 1)
    return path.name


def own_name(model_id: str | None, source: ModelSource, model_dir: Path | None = None) -> str:
    """`source`: what is served (after download); `model_dir`: MODEL_ID's own directory when it names one."""
    if source.repo_id is not None:
        return source.repo_id
    if model_dir is not None:
        return directory_name(model_dir)
    if model_id and is_hub_id(model_id):  # a prebuilt engine served beside the hub checkpoint it was built from
        return model_id
    if source.path is None:
        raise ValueError("a model source has a hub id or a path")
    return directory_name(Path(source.path))


def served_name(
    served_model_name: str | None, model_id: str | None, source: ModelSource, model_dir: Path | None
) -> str:
    return served_model_name or own_name(model_id, source, model_dir)
