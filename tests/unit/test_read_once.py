"""A full `prepare` reads each fact of the model once: a prebuilt engine's config.json (its ranks, version,
parallelism and limits), the model list, and MODEL_ID's own directory beside ENGINE_DIR. Counted in-process, through
the same `run` a container start calls."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from harness.image import Image, templates_for
from trtllm_entrypoint import main
from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.model import support as models


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, which: Callable[..., bool] = lambda *a: True):
    """The arguments of every call of `owner.name` for which `which` holds, as the calls go on."""
    calls: list[tuple] = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        if which(*args):
            calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def prepare(image: Image, capsys: pytest.CaptureFixture, **env: str) -> dict:
    assert main.run(["prepare"], {**image.env, **env}) == 0
    return json.loads(capsys.readouterr().out)


def test_a_prebuilt_engine_beside_model_id_is_read_once_and_model_id_s_directory_looked_at_once(
    image, monkeypatch, capsys
):
    """The seeds' layout: ENGINE_DIR holds the engine, MODEL_ID the checkpoint it was built from."""
    engine = image.prebuilt()
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the tokenizer is the checkpoint's
        (engine / name).unlink()
    (engine / "config.json").write_text(
        json.dumps(
            {
                "version": "0.17.0",
                "build_config": {"max_batch_size": 8, "max_num_tokens": 4096},
                "pretrained_config": {"mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
            }
        )
    )
    reads = count_calls(monkeypatch, engine_config, "_read_engine_config")
    loads = count_calls(monkeypatch, models, "load")
    looks = count_calls(monkeypatch, os.path, "isdir", lambda path: str(path) == str(image.model))

    out = prepare(image, capsys, ENGINE_DIR=str(engine))

    assert reads == [(engine,)], "the engine's config.json is read once, while the model is resolved"
    assert loads == [], "an engine needs no model list"
    assert len(looks) == 1, "MODEL_ID's directory beside ENGINE_DIR is looked at once"
    plan = out["plan"]
    assert (plan["engine"], plan["world_size"], plan["tokenizer"]) == ("prebuilt", 1, str(image.model))
    assert plan["taken_from_engine"] == {"max_batch_size": 8, "max_num_tokens": 4096}
    assert plan["engine_spec"]["max_batch_size"] == 8


@pytest.mark.process  # builds the engine: the trtllm-build double runs
def test_a_checkpoint_built_into_the_cache_loads_the_model_list_once(image, monkeypatch, capsys):
    for name, value in image.env.items():  # nvidia-smi and trtllm-build are found through this process's PATH
        monkeypatch.setenv(name, value)
    loads = count_calls(monkeypatch, models, "load")
    out = prepare(image, capsys, WORKFLOW="engine")
    assert len(loads) == 1, "the model list is read once: the support check keeps the converter for the build"
    assert out["plan"]["engine"] == "cache" and image.builds() == 1
