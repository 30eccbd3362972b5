"""The filled Triton repository across starts, the entrypoint in a real process: every upstream template set filled,
content-addressed and reused, rewritten when damaged or stale, and a REPOSITORY_DIR never taken from its owner.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from harness.image import TEMPLATE_SETS, Image, records, templates_for
from tests.unit.entrypoint_runs import free_port, snapshot
from trtllm_entrypoint import contract
from trtllm_entrypoint.repository.fill import structural_placeholders

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


def model_configs(repo: Path) -> dict:
    """Every config.pbtxt parsed by Triton's own ModelConfig protobuf (from tritonclient)."""
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    configs = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        configs[path.parent.name] = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return configs


def assert_ensemble_wired(configs: dict) -> None:
    ensembles = [c for c in configs.values() if c.platform == "ensemble"]
    assert ensembles, "the engine workflow serves an ensemble"
    for ensemble in ensembles:
        steps = ensemble.ensemble_scheduling.step
        produced = {t.name for t in ensemble.input} | {v for step in steps for v in step.output_map.values()}
        for step in steps:
            assert step.model_name in configs, f"ensemble step names a missing model {step.model_name}"
            model = configs[step.model_name]
            assert set(step.input_map) <= {t.name for t in model.input}, step.model_name
            assert set(step.output_map) <= {t.name for t in model.output}, step.model_name
            assert set(step.input_map.values()) <= produced, step.model_name
        assert {t.name for t in ensemble.output} <= produced


@pytest.mark.parametrize("templates,tag", TEMPLATE_SETS)
def test_prepare_fills_every_upstream_template_version(tmp_path, templates, tag):
    img = Image(tmp_path, tag, templates_for(templates))
    result = img.run("prepare", WORKFLOW="engine")
    assert result.returncode == 0, result.stderr
    launch = json.loads(result.stdout)
    assert launch["argv"][0] == contract.TRITONSERVER
    assert f"--model-repository={img.repo}" in launch["argv"]
    for config in img.repo.glob("*/config.pbtxt"):
        assert not structural_placeholders(config.read_text()), config
    configs = model_configs(img.repo)
    assert {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"} <= set(configs)
    assert_ensemble_wired(configs)
    engine_param = configs["tensorrt_llm"].parameters[
        "gpt_model_path" if "gpt_model_path" in configs["tensorrt_llm"].parameters else "engine_dir"
    ]
    assert engine_param.string_value == launch["engine_dir"]
    assert Path(launch["engine_dir"]).parent == img.cache / "engines"
    assert img.builds() == 1


def test_llmapi_workflow_writes_model_yaml_and_builds_nothing(tmp_path):
    img = Image(tmp_path, "26.07", templates_for("triton_backend"))
    result = img.run("prepare", WORKFLOW="llmapi", TP_SIZE="2", NVIDIA_SMI_DOUBLE_GPUS="none")
    assert result.returncode == 0, result.stderr
    model_yaml = (img.repo / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert str(img.model) in model_yaml
    assert "tensor_parallel_size: 2" in model_yaml
    assert img.builds() == 0
    model_configs(img.repo)  # parses


def test_default_repository_is_content_addressed_and_reused(image):
    first = image.run("prepare", REPOSITORY_DIR="")
    second = image.run("prepare", REPOSITORY_DIR="")
    other = image.run("prepare", REPOSITORY_DIR="", DECOUPLED="true")
    assert first.returncode == second.returncode == other.returncode == 0, first.stderr + other.stderr
    repo = Path(json.loads(first.stdout)["repository"])
    assert repo.parent == image.cache / "repositories"
    assert json.loads(second.stdout)["repository"] == str(repo)
    assert "model repository up to date" in second.stderr
    assert json.loads(other.stdout)["repository"] != str(repo)
    assert repo.stat().st_mode & 0o777 == 0o755, "readable by replicas under other UIDs"


def test_a_repository_we_filled_is_served_as_it_is(image):
    first = image.run("prepare")
    assert first.returncode == 0, first.stderr
    again = image.run("prepare", MODEL_ID=str(image.repo), REPOSITORY_DIR=str(image.root / "unused"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["repository"] == str(image.repo)
    assert again.stderr.count("serving it as given") == 1
    assert not (image.root / "unused").exists() and image.builds() == 1


def test_new_template_files_make_a_new_repository(image):
    first = json.loads(image.run("prepare", REPOSITORY_DIR="").stdout)["repository"]
    model_py = image.paths["app"] / "all_models" / "inflight_batcher_llm" / "preprocessing" / "1" / "model.py"
    model_py.parent.mkdir(parents=True, exist_ok=True)
    model_py.write_text("# the next image's preprocessing\n")
    second = json.loads(image.run("prepare", REPOSITORY_DIR="").stdout)["repository"]
    assert second != first
    assert (Path(second) / "preprocessing" / "1" / "model.py").read_text() == model_py.read_text()


def test_a_tampered_cached_model_py_is_replaced_from_the_image(image):
    template = image.paths["app"] / "all_models" / "inflight_batcher_llm" / "preprocessing" / "1" / "model.py"
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text("# the image's preprocessing\n")
    first = image.run("prepare", REPOSITORY_DIR="")
    assert first.returncode == 0, first.stderr
    repo = Path(json.loads(first.stdout)["repository"])
    model_py = repo / "preprocessing" / "1" / "model.py"
    original = model_py.read_bytes()
    model_py.write_text("open('/tmp/pwned', 'w')\n")
    planted = repo / "postprocessing" / "1" / "__pycache__" / "model.cpython-312.pyc"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"planted bytecode")
    again = image.run("prepare", REPOSITORY_DIR="")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["repository"] == str(repo)
    (warning,) = [line for line in again.stderr.splitlines() if "differs from this image's templates" in line]
    assert warning.endswith("files=preprocessing/1/model.py")
    assert model_py.read_bytes() == original == template.read_bytes() and not planted.exists()
    third = image.run("prepare", REPOSITORY_DIR="")
    assert "model repository up to date" in third.stderr and "differs" not in third.stderr


def test_a_repository_dir_we_did_not_write_is_refused_and_kept(image, tmp_path):
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "todo.txt").write_text("keep me")
    result = image.run("prepare", REPOSITORY_DIR=str(mine))
    assert result.returncode == 2, result.stderr
    assert "was not written by trtllm-entrypoint" in result.stderr
    assert snapshot(mine) == {"notes/todo.txt": b"keep me"} and image.builds() == 0


def test_a_damaged_cached_repository_is_rewritten_not_served(image):
    first = image.run("prepare", REPOSITORY_DIR="")
    repo = Path(json.loads(first.stdout)["repository"])
    config = repo / "ensemble" / "config.pbtxt"
    good = config.read_text()
    config.write_text(good[: len(good) // 2])
    second = image.run("prepare", REPOSITORY_DIR="")
    assert second.returncode == 0, second.stderr
    assert "model repository up to date" not in second.stderr
    # Every file is compared with what the image writes (served_code) before the stamp is trusted.
    assert "removing a copy published earlier" in second.stderr
    assert "differs from this image's templates" in second.stderr and "files=ensemble/config.pbtxt" in second.stderr
    assert config.read_text() == good
    (repo / "preprocessing" / "config.pbtxt").unlink()
    assert image.run("prepare", REPOSITORY_DIR="").returncode == 0
    assert (repo / "preprocessing" / "config.pbtxt").is_file()


def test_leftovers_of_a_killed_fill_are_removed_at_the_next_start(image):
    for leftover in (".repository.new-abc123", ".repository.old-def456"):
        (image.root / leftover / "ensemble").mkdir(parents=True)
    result = image.run("prepare")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in image.root.iterdir() if p.name.startswith(".repository")) == [".repository.lock"]


def test_replicas_sharing_a_repository_dir_with_different_settings_fail_loudly(image):
    engine = image.prebuilt()  # served through the stock KServe command line: it fills REPOSITORY_DIR, then execs
    server = image.start(
        "tritonserver",
        f"--model-store={engine}",
        f"--http-port={free_port()}",
        f"--grpc-port={free_port()}",
        f"--metrics-port={free_port()}",
        MODEL_ID="",
    )
    try:
        deadline = time.monotonic() + 60
        while not records(image.records, "tritonserver"):
            assert time.monotonic() < deadline and server.poll() is None, server.communicate()[1]
            time.sleep(0.1)
        same = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="")
        assert same.returncode == 0, same.stderr
        other = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="", DECOUPLED="true")
        assert other.returncode == 1, other.stderr
        (error,) = [line for line in other.stderr.splitlines() if line.startswith("error: ")]
        assert "is served by another server" in error and "differs from what these settings write" in error
        assert "decoupled: false" in (image.repo / "tensorrt_llm" / "config.pbtxt").read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    # a restart with new settings rewrites it
    alone = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="", DECOUPLED="true")
    assert alone.returncode == 0, alone.stderr
    assert "decoupled: true" in (image.repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_templates_dir_may_name_the_inflight_batcher_llm_folder_the_seeds_copy(image):
    result = image.run("prepare", TEMPLATES_DIR=str(image.templates / "inflight_batcher_llm"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in image.repo.iterdir() if p.is_dir()) == [
        "ensemble",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm",
    ]  # and no BLS model unless ENABLE_BLS=true


@pytest.mark.parametrize(
    "add",
    ["my_model/config.pbtxt", "notes.txt", "preprocessing/1/helper.py", "empty_dir/", "preprocessing/__pycache__/x.py"],
)
@pytest.mark.parametrize("settings", [{}, {"MAX_BATCH_SIZE": "4"}])
def test_files_a_user_adds_to_repository_dir_are_refused_never_deleted(image, add, settings):
    first = image.run("prepare")
    assert first.returncode == 0, first.stderr
    (image.repo / "preprocessing" / "1" / "__pycache__").mkdir()  # what the server writes is not the user's
    (image.repo / "preprocessing" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    added = image.repo / add
    added.parent.mkdir(parents=True, exist_ok=True)
    if add.endswith("/"):
        added.mkdir()
    else:
        added.write_text("the user's")
    before = snapshot(image.repo)
    result = image.run("prepare", **settings)  # same settings, or settings that rewrite the repository
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "REPOSITORY_DIR" in error and add.split("/")[0] in error and "__pycache__/model" not in error
    assert snapshot(image.repo) == before and added.exists()


def test_the_servers_bytecode_does_not_keep_repository_dir_from_being_rewritten(image):
    assert image.run("prepare").returncode == 0
    (image.repo / "preprocessing" / "1" / "__pycache__").mkdir()
    (image.repo / "preprocessing" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"pyc")
    result = image.run("prepare", MAX_BATCH_SIZE="4")
    assert result.returncode == 0, result.stderr
    assert "max_batch_size: 4" in (image.repo / "tensorrt_llm" / "config.pbtxt").read_text()
