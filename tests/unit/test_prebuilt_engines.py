"""Prebuilt engines (ENGINE_DIR, MODEL_ID naming one), the entrypoint in a real process: served with their own ranks
and limits, refused or rebuilt when another TensorRT-LLM built them.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.image import Image, templates_for
from tests.unit.entrypoint_runs import without_tokenizer

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


def test_prebuilt_engine_prepares_without_a_gpu_but_build_engine_needs_one(image):
    built = image.run("build-engine")
    assert built.returncode == 0, built.stderr
    engine_dir = json.loads(built.stdout)["engine_dir"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (Path(engine_dir) / name).write_bytes((image.model / name).read_bytes())
    prepared = image.run("prepare", ENGINE_DIR=engine_dir, MODEL_ID="", NVIDIA_SMI_DOUBLE_GPUS="none")
    assert prepared.returncode == 0, prepared.stderr
    assert json.loads(prepared.stdout)["engine_dir"] == engine_dir
    no_gpu = image.run("build-engine", CACHE_DIR=str(image.root / "other"), NVIDIA_SMI_DOUBLE_GPUS="none")
    assert no_gpu.returncode == 1
    assert "GPU" in no_gpu.stderr


def test_engine_from_another_tensorrt_llm_is_refused(tmp_path, image):
    other = Image(tmp_path / "other", "25.01", templates_for("v0.17.0"), trtllm_version="0.16.0")
    built = other.run("build-engine")
    assert built.returncode == 0, built.stderr
    engine_dir = json.loads(built.stdout)["engine_dir"]
    result = image.run("prepare", ENGINE_DIR=engine_dir, MODEL_ID="")
    assert result.returncode == 1
    assert "0.16.0" in result.stderr and "0.17.0" in result.stderr


def test_model_id_naming_an_engine_from_another_tensorrt_llm_is_refused_not_served(tmp_path, image):
    other = Image(tmp_path / "other", "25.01", templates_for("v0.17.0"), trtllm_version="0.16.0")
    engine_dir = json.loads(other.run("build-engine").stdout)["engine_dir"]
    result = image.run("prepare", MODEL_ID=engine_dir)  # nothing else to rebuild it from
    assert result.returncode == 1, result.stdout
    assert "built with TensorRT-LLM 0.16.0, this image has 0.17.0" in result.stderr
    assert image.builds() == 0 and not image.repo.exists()


def test_engine_from_another_tensorrt_llm_is_rebuilt_from_model_id(tmp_path, image):
    other = Image(tmp_path / "other", "25.01", templates_for("v0.17.0"), trtllm_version="0.16.0")
    old_engine = json.loads(other.run("build-engine").stdout)["engine_dir"]  # no tokenizer files beside it
    result = image.run("prepare", ENGINE_DIR=old_engine)  # MODEL_ID (the checkpoint) is set by the fixture
    assert result.returncode == 0, result.stderr
    assert "rebuilding from MODEL_ID" in result.stderr
    new_engine = json.loads(result.stdout)["engine_dir"]
    assert new_engine != old_engine and image.builds() == 1
    assert json.loads((Path(new_engine) / "config.json").read_text())["version"] == "0.17.0"


def test_prebuilt_engine_on_an_llmapi_default_image_uses_the_engine_workflow(tmp_path):
    img = Image(tmp_path, "26.07", templates_for("triton_backend"))
    engine_dir = Path(json.loads(img.run("build-engine", WORKFLOW="engine").stdout)["engine_dir"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (engine_dir / name).write_bytes((img.model / name).read_bytes())
    served = img.run("prepare", MODEL_ID=str(engine_dir))
    assert served.returncode == 0, served.stderr
    printed = json.loads(served.stdout)
    assert printed["engine_dir"] == str(engine_dir)
    assert (printed["plan"]["workflow"], printed["plan"]["engine"]) == ("engine", "prebuilt"), "prepare prints the plan"
    assert (img.repo / "ensemble" / "config.pbtxt").exists()
    blank = img.run("prepare", MODEL_ID=str(engine_dir), WORKFLOW="  ")  # blank counts as unset
    assert blank.returncode == 0, blank.stderr
    refused = img.run("prepare", MODEL_ID=str(engine_dir), WORKFLOW="llmapi")
    assert refused.returncode == 2 and "WORKFLOW=llmapi cannot serve the prebuilt engine" in refused.stderr


def test_an_engine_published_by_the_cache_may_be_served_from_it(image):
    engine_dir = json.loads(image.run("build-engine").stdout)["engine_dir"]
    assert Path(engine_dir).parent == image.cache / "engines"
    result = image.run("prepare", ENGINE_DIR=engine_dir)  # inside CACHE_DIR, which build-engine prints: allowed
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["engine_dir"] == engine_dir and image.builds() == 1


def test_seeds_layout_engine_dir_with_model_id_takes_the_tokenizer_from_the_checkpoint(image):
    engine = without_tokenizer(image.prebuilt())
    result = image.run("prepare", ENGINE_DIR=str(engine))  # MODEL_ID is the checkpoint (fixture)
    assert result.returncode == 0, result.stderr
    assert f'"{image.model}"' in (image.repo / "preprocessing" / "config.pbtxt").read_text()
    assert f'"{engine}"' in (image.repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_a_prebuilt_engine_is_served_with_the_limits_it_was_built_with(image):
    engine = image.prebuilt()  # built for max_batch_size 8
    result = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="")
    assert result.returncode == 0, result.stderr
    for model in ("tensorrt_llm", "ensemble", "preprocessing"):
        assert "max_batch_size: 8\n" in (image.repo / model / "config.pbtxt").read_text(), model
    assert "serving the limits the engine was built with max_batch_size=8" in result.stderr
    printed = json.loads(result.stdout)["plan"]  # the final plan: what is served, not what was asked
    assert printed["engine_spec"]["max_batch_size"] == 8 and printed["taken_from_engine"] == {"max_batch_size": 8}
    assert printed["engine_dir"] == str(engine) and printed["repository"] == str(image.repo)
