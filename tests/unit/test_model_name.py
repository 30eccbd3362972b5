"""The name OpenAI clients send: the model's own unless SERVED_MODEL_NAME says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtllm_entrypoint.model.locate import ModelSource
from trtllm_entrypoint.model.name import own_name, served_name


def local(path: str) -> ModelSource:
    return ModelSource(kind="checkpoint", path=Path(path), repo_id=None, revision=None, read_only=False)


def hub(repo_id: str, path: str | None = None) -> ModelSource:
    return ModelSource(kind="hub", path=Path(path) if path else None, repo_id=repo_id, revision="main", read_only=False)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        (hub("meta-llama/Llama-3.1-8B-Instruct"), "meta-llama/Llama-3.1-8B-Instruct"),
        # downloaded: the id stays the name, not the snapshot's commit
        (
            hub("Qwen/Qwen3-0.6B", "/var/cache/trtllm/models/hub/models--Qwen--Qwen3-0.6B/snapshots/abc123"),
            "Qwen/Qwen3-0.6B",
        ),
        (local("/models/Llama-3.1-8B-Instruct"), "Llama-3.1-8B-Instruct"),
        (local("/data/llama-engine"), "llama-engine"),
        # a hub cache mounted as is: the snapshot gives back the id
        (
            local("/root/.cache/huggingface/hub/models--TinyLlama--TinyLlama-1.1B-Chat-v1.0/snapshots/fe8a4ea"),
            "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        ),
        (local("/hub/models--gpt2/snapshots/607a30d"), "gpt2"),
        (local("/hub/models--/snapshots/607a30d"), "607a30d"),  # not a cache layout
    ],
)
def test_the_model_is_served_under_its_own_name(source, name):
    model_id = source.repo_id or str(source.path)
    assert own_name(model_id, source) == name
    assert served_name(None, model_id, source, None) == name


def test_a_prebuilt_engine_takes_the_name_of_the_checkpoint_beside_it():
    engine = ModelSource(kind="engine", path=Path("/engines/llama"), repo_id=None, revision=None, read_only=False)
    assert own_name("/models/Llama-3.1-8B", engine, Path("/models/Llama-3.1-8B")) == "Llama-3.1-8B"
    assert own_name("meta-llama/Llama-3.1-8B", engine, None) == "meta-llama/Llama-3.1-8B"  # MODEL_ID, a hub id
    assert own_name(None, engine, None) == "llama"  # ENGINE_DIR alone


def test_served_model_name_overrides_it():
    assert (
        served_name("chat", "meta-llama/Llama-3.1-8B-Instruct", hub("meta-llama/Llama-3.1-8B-Instruct"), None) == "chat"
    )
    # KServe's runtime passes the InferenceService's name: /mnt/models says nothing
    assert served_name("my-isvc", None, local("/mnt/models"), None) == "my-isvc"
