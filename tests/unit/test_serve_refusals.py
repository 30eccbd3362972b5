"""Bad input refused before anything is written or built, the entrypoint in a real process: one line naming what
was wrong, exit 2, nothing half-done.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.image import records
from harness.tiny_checkpoint import tiny_llama
from tests.unit.entrypoint_runs import snapshot, without_tokenizer

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


BAD_INPUT = [
    ({"TP_SIZE": "zero"}, "TP_SIZE"),
    ({"TP_SIZE": "3"}, "TP_SIZE"),
    ({"PP_SIZE": "-1"}, "PP_SIZE"),
    ({"DTYPE": "fp64"}, "DTYPE"),
    ({"QUANTIZATION": "int3"}, "QUANTIZATION"),
    ({"MAX_BATCH_SIZE": "0"}, "MAX_BATCH_SIZE"),
    ({"MAX_SEQ_LEN": "100", "MAX_INPUT_LEN": "200"}, "MAX_SEQ_LEN"),
    ({"KV_CACHE_FREE_GPU_MEM_FRACTION": "1.5"}, "KV_CACHE_FREE_GPU_MEM_FRACTION"),
    ({"ENABLE_KV_CACHE_REUSE": "maybe"}, "ENABLE_KV_CACHE_REUSE"),
    ({"DECOUPLED": "2"}, "DECOUPLED"),
    ({"HTTP_PORT": "70000"}, "HTTP_PORT"),
    ({"GRPC_PORT": "8000"}, "GRPC_PORT"),
    ({"WORKFLOW": "llmapi"}, "WORKFLOW"),  # 25.01 (TensorRT-LLM 0.17) has no LLM API model
    ({"WORKFLOW": "onnx"}, "WORKFLOW"),
    ({"FRONTEND": "grpc"}, "FRONTEND"),
    ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
    ({"MODEL_ID": "not a model id"}, "MODEL_ID"),
    ({"MODEL_ID": "/does/not/exist"}, "MODEL_ID"),
    ({"TRITON_ARGS": "--log-verbose='1"}, "TRITON_ARGS"),
    ({"MATRIX_TAG": "99.99"}, "MATRIX_TAG"),
    ({"SERVED_MODEL_NAME": "a/b"}, "SERVED_MODEL_NAME"),
    ({"RESTRICTED_APIS": "logging,everything"}, "RESTRICTED_APIS"),
    ({"TRITON_ARGS": "--http-restricted-api=logging:k=v"}, "TRITON_ARGS"),
    ({"TRITON_ADMIN_KEY": "short"}, "TRITON_ADMIN_KEY"),
    ({"TRITON_ADMIN_KEY_FILE": "/does/not/exist"}, "TRITON_ADMIN_KEY_FILE"),
    # once refused only after the engine build, or with a traceback
    ({"SERVED_MODEL_NAME": "tensorrt_llm"}, "SERVED_MODEL_NAME"),
    ({"MODEL_ID": "/models/${MODEL}"}, "MODEL_ID"),
    ({"TP_SIZE": "²"}, "TP_SIZE"),
    ({"PP_SIZE": "٨"}, "PP_SIZE"),
    ({"HF_TOKEN_FILE": "/dev/zero"}, "HF_TOKEN_FILE"),
    ({"HF_TOKEN": "hf_schlüssel"}, "HF_TOKEN"),
    ({"MODEL_ID": "org/name-"}, "MODEL_ID"),
    ({"MODEL_ID": "org/name."}, "MODEL_ID"),
    ({"MODEL_ID": "org/" + "n" * 97}, "MODEL_ID"),
    ({"TRITON_ARGS": "--http-port=9999"}, "TRITON_ARGS"),
    ({"TRITON_ARGS": "--model-repository=/elsewhere"}, "TRITON_ARGS"),
]


@pytest.mark.parametrize("overrides,variable", BAD_INPUT)
def test_bad_input_exits_2_naming_the_variable_and_writes_nothing(image, overrides, variable):
    result = image.run("prepare", **overrides)
    assert result.returncode == 2, result.stderr
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("error: ") and variable in first_line, result.stderr
    assert not image.cache.exists() and not image.repo.exists()
    assert image.builds() == 0


def test_late_bad_input_is_refused_before_the_engine_build(image, tmp_path):
    cases = {
        "TEMPLATES_DIR": {"TEMPLATES_DIR": str(tmp_path / "no-templates")},
        "tokenizer": {"MODEL_ID": str(without_tokenizer(tiny_llama(tmp_path / "bare")))},
    }
    for named, overrides in cases.items():
        result = image.run("prepare", **overrides)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert named in error, error
        assert image.builds() == 0 and not image.cache.exists() and not image.repo.exists()


def test_unusable_cache_dir_is_one_clear_error_not_a_traceback(image, tmp_path):
    (tmp_path / "a-file").write_text("")
    result = image.run("prepare", CACHE_DIR=str(tmp_path / "a-file" / "cache"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error == f"error: {tmp_path / 'a-file' / 'cache'}: Not a directory"
    assert "CACHE_DIR" in result.stderr.splitlines()[-1]


# Each names a directory that holds something of the user's, or that we write: all refused before any write.
OVERLAPS = {
    "REPOSITORY_DIR is the checkpoint": lambda img: {"REPOSITORY_DIR": str(img.model)},
    "REPOSITORY_DIR is the checkpoint's parent": lambda img: {"REPOSITORY_DIR": str(img.model.parent)},
    "REPOSITORY_DIR is CACHE_DIR": lambda img: {"REPOSITORY_DIR": str(img.cache)},
    "REPOSITORY_DIR inside the templates": lambda img: {"REPOSITORY_DIR": str(img.templates / "inflight_batcher_llm")},
    "REPOSITORY_DIR holds the engine": lambda img: {
        "ENGINE_DIR": str(img.prebuilt()),
        "REPOSITORY_DIR": str(img.root / "engines"),
    },
    "CACHE_DIR is the templates": lambda img: {"CACHE_DIR": str(img.templates)},
    "CACHE_DIR is the checkpoint": lambda img: {"CACHE_DIR": str(img.model)},
    "CACHE_DIR inside the checkpoint": lambda img: {"CACHE_DIR": str(img.model / "cache")},
    "REPOSITORY_DIR under a link to the checkpoint": lambda img: {
        "REPOSITORY_DIR": str(link(img.root / "link", img.model) / "repo")
    },
}


def link(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


@pytest.mark.parametrize("case", OVERLAPS)
def test_overlapping_directories_are_refused_before_any_write(image, case):
    overrides = OVERLAPS[case](image)
    before = snapshot(image.root / "models"), snapshot(image.templates)
    result = image.run("prepare", **overrides)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "is not allowed" in error and "apart from" in error
    assert (snapshot(image.root / "models"), snapshot(image.templates)) == before
    assert image.builds() == 0 and not (image.cache / "engines").exists()


def test_a_prebuilt_engine_missing_a_rank_is_refused_before_anything_runs(image):
    engine = image.prebuilt(world_size=2)
    (engine / "rank1.engine").unlink()
    result = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="")
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "built for 2 ranks" in error and "rank1.engine" in error
    assert not image.repo.exists() and not records(image.records, "mpirun")


def test_missing_tokenizer_hint_does_not_ask_for_model_id_when_it_is_set(image, tmp_path):
    engine = without_tokenizer(image.prebuilt())
    without_tokenizer(image.model)
    result = image.run("prepare", ENGINE_DIR=str(engine))
    assert result.returncode == 2, result.stderr
    hint = result.stderr.splitlines()[-1]
    assert hint.startswith("hint: ") and "set MODEL_ID" not in hint and "beside the engine" in hint
    assert image.builds() == 0 and not image.repo.exists()


@pytest.mark.parametrize("with_checkpoint", [False, True], ids=["engine alone", "engine and MODEL_ID"])
def test_a_limit_above_the_prebuilt_engine_s_is_refused_before_anything_is_written(image, with_checkpoint):
    model_id = str(image.model) if with_checkpoint else ""
    result = image.run("prepare", ENGINE_DIR=str(image.prebuilt()), MODEL_ID=model_id, MAX_BATCH_SIZE="64")
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "MAX_BATCH_SIZE=64 is not allowed: expected at most 8" in error
    assert not image.repo.exists() and not image.cache.exists()


@pytest.mark.parametrize("command", [["serve"], ["--log-verbose=1"]])
def test_serve_refuses_more_ranks_than_visible_gpus_before_building(image, command):
    result = image.run(*command, TP_SIZE="2")  # the double shows one GPU
    assert result.returncode != 0
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "2 GPU" in error, error
    assert image.builds() == 0 and image.published() == [] and not image.repo.exists()
    assert not records(image.records, "tritonserver") and not records(image.records, "mpirun")


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


def _huge(path: Path) -> None:
    with open(path, "wb") as file:
        file.truncate(65 << 20)  # sparse: no disk used


MALFORMED = {
    "architectures of numbers": ("config.json", lambda p: p.write_text('{"architectures": [1]}')),
    "model_type a number": ("config.json", lambda p: p.write_text('{"model_type": 5}')),
    "config a FIFO": ("config.json", _fifo),
    "config a directory": ("config.json", _directory),
    "config not UTF-8": ("config.json", lambda p: p.write_bytes(b'{"model_type": "\xff\xfe"}')),
    "config huge": ("config.json", _huge),
    "config a list": ("config.json", lambda p: p.write_text("[]")),
    "tokenizer_config not JSON": ("tokenizer_config.json", lambda p: p.write_text("{not json")),
    "tokenizer_config not UTF-8": ("tokenizer_config.json", lambda p: p.write_bytes(b"\xff\xfe\x00")),
    "tokenizer_config a directory": ("tokenizer_config.json", _directory),
    "tokenizer_config a FIFO": ("tokenizer_config.json", _fifo),
    "tokenizer.json a list": ("tokenizer.json", lambda p: p.write_text("[1, 2]")),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_model_file_is_one_error_line_and_exit_2(image, tmp_path, case):
    name, spoil = MALFORMED[case]
    model = tiny_llama(tmp_path / "spoiled")
    spoil(model / name)
    result = image.run("prepare", MODEL_ID=str(model))  # run() times out after 120 s: nothing may hang
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and name in errors[0] and "Traceback" not in result.stderr, result.stderr
    assert image.builds() == 0 and not image.repo.exists() and not (image.cache / "engines").exists()


@pytest.mark.parametrize(
    "mapping",
    [{"world_size": "abc"}, {"world_size": 10**9}, {"world_size": 0}, {"tp_size": [2]}, "not an object"],
)
def test_a_malformed_engine_config_is_one_error_line_and_exit_2(image, mapping):
    engine = image.prebuilt()
    config = json.loads((engine / "config.json").read_text())
    config["pretrained_config"] = {"mapping": mapping}
    (engine / "config.json").write_text(json.dumps(config))
    result = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="")
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "config.json" in error and "Traceback" not in result.stderr
