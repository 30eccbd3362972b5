"""The entrypoint as a user runs it: `trtllm-entrypoint prepare|serve|build-engine|…` in a real process.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.fake_hub import FakeHub
from harness.image import TEMPLATE_SETS, Image, records, templates_for
from harness.tiny_checkpoint import tiny_llama
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.fill import structural_placeholders

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


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


def test_second_start_reuses_the_engine(image):
    first = image.run("prepare")
    second = image.run("prepare")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["engine_dir"] == json.loads(second.stdout)["engine_dir"]
    assert image.builds() == 1
    assert "cache=hit" in second.stderr


def test_the_same_checkpoint_mounted_elsewhere_reuses_the_engine_and_a_changed_byte_does_not(image):
    first = image.run("prepare")
    moved = image.model.parent.parent / "mnt" / "models"  # where KServe mounts what Docker had at /models/x
    shutil.copytree(image.model, moved)
    second = image.run("prepare", MODEL_ID=str(moved))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["engine_dir"] == json.loads(second.stdout)["engine_dir"]
    assert image.builds() == 1 and "cache=hit" in second.stderr
    weights = max((p for p in moved.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1  # one bit, same size
    weights.write_bytes(bytes(data))
    third = image.run("prepare", MODEL_ID=str(moved))
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["engine_dir"] != json.loads(first.stdout)["engine_dir"]
    assert image.builds() == 2


def test_changed_build_setting_builds_a_new_engine(image):
    assert image.run("prepare").returncode == 0
    other = image.run("prepare", MAX_BATCH_SIZE="8")
    assert other.returncode == 0, other.stderr
    assert image.builds() == 2
    assert len(image.published()) == 2


def test_four_concurrent_prepares_on_an_empty_cache_build_once(image):
    procs = [image.start("prepare", TRTLLM_BUILD_DOUBLE_SLEEP="1") for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outputs]
    assert image.builds() == 1
    assert len({json.loads(out)["engine_dir"] for out, _ in outputs}) == 1


def test_build_killed_midway_is_never_loaded_and_the_next_start_rebuilds(image):
    proc = image.start("prepare", TRTLLM_BUILD_DOUBLE_SLEEP="60")
    deadline = time.monotonic() + 60
    while image.builds() == 0:
        assert time.monotonic() < deadline and proc.poll() is None, "the build never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert image.published() == []
    result = image.run("prepare")
    assert result.returncode == 0, result.stderr
    assert image.builds() == 2
    assert len(image.published()) == 1
    leftovers = [p.name for p in (image.cache / "engines").iterdir() if ".new-" in p.name]
    assert leftovers == []


def test_failed_build_exits_non_zero_and_publishes_nothing(image):
    result = image.run("prepare", TRTLLM_BUILD_DOUBLE_FAIL="1")
    assert result.returncode == 1
    assert "trtllm-build" in result.stderr
    assert image.published() == []


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


def without_tokenizer(model: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    return model


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


def test_token_never_appears_in_output_or_files(image):
    token = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    result = image.run("prepare", HF_TOKEN=token, LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    assert_secret_nowhere(token, image, result)


def assert_secret_nowhere(secret: str, image: Image, result: subprocess.CompletedProcess) -> None:
    assert secret not in result.stdout + result.stderr
    for path in [*image.cache.rglob("*"), *image.repo.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_json_logs_are_one_object_per_line_with_phase_durations(image):
    result = image.run("prepare", LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    phases = {e["phase"]: e for e in events if e.get("msg") == "phase done"}
    assert {"resolve", "engine", "fill"} <= set(phases)
    assert all(isinstance(e["seconds"], float) for e in phases.values())


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


def test_check_reports_versions_and_fails_on_too_few_gpus(image):
    ok = image.run("check")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["installed"]["tensorrt_llm"] == "0.17.0"
    assert report["gpus"][0]["compute_capability"] == "9.0"
    short = image.run("check", TP_SIZE="2")
    assert short.returncode == 1
    assert "needs 2 GPUs" in short.stderr


def test_a_misspelt_variable_is_warned_about_by_name_and_refused_with_strict_env(image):
    warned = image.run("check", MAX_BATCH_SIZ="8", DECOUPLE="true")
    assert warned.returncode == 0, warned.stderr
    assert "ignoring MAX_BATCH_SIZ (did you mean MAX_BATCH_SIZE?)" in warned.stderr
    assert "ignoring DECOUPLE (did you mean DECOUPLED?)" in warned.stderr
    refused = image.run("prepare", MAX_BATCH_SIZ="8", STRICT_ENV="true")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: not a variable trtllm-entrypoint reads: MAX_BATCH_SIZ (did you mean")
    assert image.builds() == 0


TYPED_KEY = "my-value-0123456789"


@pytest.mark.parametrize(
    "store, own, completed",
    [
        ("--model-store", [], []),
        ("--model-st", [f"--http-restricted-api=logging:my-key={TYPED_KEY}"], ["--grpc-restricted-protocol"]),
        ("--model-repo", [f"--http-restricted=logging:my-key={TYPED_KEY}"], ["--grpc-restricted-protocol"]),
        ("--model-repository", [f"--grpc-restricted-p=trace:my-key={TYPED_KEY}"], ["--http-restricted-api"]),
    ],
)
def test_stock_kserve_tritonserver_command_is_given_a_filled_repository(image, store, own, completed):
    built = image.run("build-engine")
    engine_dir = Path(json.loads(built.stdout)["engine_dir"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (engine_dir / name).write_bytes((image.model / name).read_bytes())
    args = ["tritonserver", f"{store}={engine_dir}", "--grpc-port=9000", "--http-port=18080", "--allow-grpc=true", *own]
    proc = image.start(*args, MODEL_ID="", LOG_LEVEL="debug")
    try:
        deadline = time.monotonic() + 60
        while not records(image.records, "tritonserver"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1]
            time.sleep(0.1)
        argv = records(image.records, "tritonserver")[0]["argv"]
        # Any unique prefix is the option, as tritonserver reads it: the repository is filled and put in its place.
        assert argv[:4] == [f"{store}={image.repo}", "--grpc-port=9000", "--http-port=18080", "--allow-grpc=true"]
        apis = "shared-memory,model-repository,statistics,trace,logging"
        if own:  # a command line that restricts one protocol itself gets the other, with the same groups and key
            group = own[0].split("=", 1)[1]
            assert argv[4:] == [*own, f"{completed[0]}={group}"]
        else:  # secure by default, with a key nobody knows (none is set)
            assert [arg.rsplit("=", 1)[0] for arg in argv[4:]] == [
                f"--http-restricted-api={apis}:admin-key",
                f"--grpc-restricted-protocol={apis}:admin-key",
            ]
            assert len(set(arg.rsplit("=", 1)[1] for arg in argv[4:])) == 1 and argv[4].rsplit("=", 1)[1]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0
    # The verbose log shows the command that was exec'd, with the filled repository in place of the engine and every
    # admin key masked, the typed one too.
    logged = " ".join(arg.rsplit("=", 1)[0] + "=***" if "restricted" in arg else arg for arg in argv)
    assert f"debug: starting the server argv=tritonserver {logged}\n" in stderr
    assert TYPED_KEY not in stderr


@pytest.mark.parametrize(
    "args, env, shown",
    [
        (["--allow-sagemaker=true", "--sagemaker-port=18081"], {}, "--allow-sagemaker=true"),
        (["--allow-sage", "1"], {}, "--allow-sage=1"),
        (["--allow-vertex-ai=on"], {}, "--allow-vertex-ai=on"),
        ([], {"AIP_MODE": "PREDICTION"}, "AIP_MODE=PREDICTION"),
    ],
)
def test_a_typed_command_may_not_open_a_route_around_the_restriction(image, args, env, shown):
    engine_dir = image.prebuilt()
    result = image.run("tritonserver", f"--model-repo={engine_dir}", *args, MODEL_ID="", **env)
    assert result.returncode == 2, result.stderr
    assert shown in result.stderr and "RESTRICTED_APIS=none" in result.stderr
    assert not records(image.records, "tritonserver") and not image.repo.exists()


def test_an_ambiguous_prefix_in_a_typed_command_is_refused_as_tritonserver_refuses_it(image):
    engine_dir = image.prebuilt()
    result = image.run("tritonserver", f"--model={engine_dir}", MODEL_ID="")
    assert result.returncode == 2
    assert "'--model' is ambiguous" in result.stderr and "--model-repository" in result.stderr
    assert not records(image.records, "tritonserver") and not image.repo.exists()


def test_arguments_starting_with_a_dash_are_appended_to_the_served_command_line(image):
    # Two ranks, so that the server is started through `mpirun` from PATH, whose double records and exits
    # (MPIRUN_DOUBLE_EXEC=0): the one-rank tritonserver path exists only in images.
    two_gpus = "NVIDIA H100 80GB HBM3|9.0|81559;NVIDIA H100 80GB HBM3|9.0|81559"
    result = image.run(
        "--log-verbose=1",
        "--log-info",
        "true",
        TP_SIZE="2",
        TRITON_ARGS="--exit-on-error=false",
        NVIDIA_SMI_DOUBLE_GPUS=two_gpus,
        MPIRUN_DOUBLE_EXEC="0",
    )
    assert result.returncode == 0, result.stderr
    assert image.builds() == 1, "served as usual: the engine was built and the repository filled"
    (mpirun,) = records(image.records, "mpirun")
    rank0, rank1 = " ".join(mpirun["argv"]).split(" : ")
    assert f"--model-repository={image.repo}" in rank0.split()
    assert rank0.endswith(" --exit-on-error=false --log-verbose=1 --log-info true"), rank0
    assert "--log-verbose" not in rank1, "like TRITON_ARGS, they go to the rank that serves the endpoints"


def test_a_dash_argument_that_sets_what_the_entrypoint_sets_is_refused(image):
    result = image.run("--http-port=9999")
    assert result.returncode == 2
    assert "error: the command line may not contain '--http-port'" in result.stderr
    assert "set HTTP_PORT instead" in result.stderr
    assert not image.cache.exists() and not image.repo.exists(), "refused before anything is written"


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


def test_other_commands_run_unchanged_with_their_exit_code(image):
    result = image.run(sys.executable, "-c", "import sys; print('ran', sys.argv[1:]); sys.exit(3)", "x")
    assert result.returncode == 3
    assert result.stdout.strip() == "ran ['x']"


def test_health_asks_the_ready_endpoint_on_the_configured_port(image, tmp_path):
    import http.server
    import threading

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = str(server.server_address[1])
    isolated = {"TMPDIR": str(tmp_path)}  # no state file from another test's serve
    try:
        assert image.run("health", HTTP_PORT=port, **isolated).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
    assert image.run("health", HTTP_PORT=port, **isolated).returncode == 1


def test_a_repository_we_filled_is_served_as_it_is(image):
    first = image.run("prepare")
    assert first.returncode == 0, first.stderr
    again = image.run("prepare", MODEL_ID=str(image.repo), REPOSITORY_DIR=str(image.root / "unused"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["repository"] == str(image.repo)
    assert again.stderr.count("serving it as given") == 1
    assert not (image.root / "unused").exists() and image.builds() == 1


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


def test_stock_kserve_command_with_a_two_gpu_engine_starts_one_rank_per_gpu(image):
    two_gpus = "NVIDIA H100 80GB HBM3|9.0|81559;NVIDIA H100 80GB HBM3|9.0|81559"
    built = image.run("build-engine", TP_SIZE="2", NVIDIA_SMI_DOUBLE_GPUS=two_gpus)
    assert built.returncode == 0, built.stderr
    engine_dir = Path(json.loads(built.stdout)["engine_dir"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (engine_dir / name).write_bytes((image.model / name).read_bytes())
    args = ["tritonserver", f"--model-store={engine_dir}", "--grpc-port=9000", "--http-port=18081", "--allow-grpc=true"]
    # The mpirun double records and exits (MPIRUN_DOUBLE_EXEC=0): the ranks' program path exists only in images.
    result = image.run(*args, MODEL_ID="", NVIDIA_SMI_DOUBLE_GPUS=two_gpus, MPIRUN_DOUBLE_EXEC="0")
    assert result.returncode == 0, result.stderr
    (mpirun,) = records(image.records, "mpirun")
    contexts = " ".join(mpirun["argv"]).split(" : ")
    assert len(contexts) == 2, mpirun["argv"]
    rank0 = contexts[0].split()
    assert {f"--model-repository={image.repo}", "--grpc-port=9000", "--http-port=18081", "--allow-grpc=true"} <= set(
        rank0
    ), rank0
    assert not any(arg.startswith("--model-store") for arg in " : ".join(contexts).split()), "no engine as repo"
    assert "--http-port=18081" not in contexts[1]  # only rank 0 serves the endpoints


def test_unusable_cache_dir_is_one_clear_error_not_a_traceback(image, tmp_path):
    (tmp_path / "a-file").write_text("")
    result = image.run("prepare", CACHE_DIR=str(tmp_path / "a-file" / "cache"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error == f"error: {tmp_path / 'a-file' / 'cache'}: Not a directory"
    assert "CACHE_DIR" in result.stderr.splitlines()[-1]


def test_new_template_files_make_a_new_repository(image):
    first = json.loads(image.run("prepare", REPOSITORY_DIR="").stdout)["repository"]
    model_py = image.paths["app"] / "all_models" / "inflight_batcher_llm" / "preprocessing" / "1" / "model.py"
    model_py.parent.mkdir(parents=True, exist_ok=True)
    model_py.write_text("# the next image's preprocessing\n")
    second = json.loads(image.run("prepare", REPOSITORY_DIR="").stdout)["repository"]
    assert second != first
    assert (Path(second) / "preprocessing" / "1" / "model.py").read_text() == model_py.read_text()


def test_error_lines_mask_a_token_given_in_a_file(image, tmp_path):
    token = "hf_filetokenfiletokenfiletoken12"
    (tmp_path / "token").write_text(token + "\n")
    result = image.run("prepare", HF_TOKEN_FILE=str(tmp_path / "token"), MODEL_ID=f"{token} x")
    assert result.returncode == 2
    assert token not in result.stderr and "***" in result.stderr


# --- model support, checked before any download or build ---------------------------------------------------------

PHI3 = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 32,
}


def phi3_checkpoint(root: Path) -> Path:
    model = tiny_llama(root / "models" / "phi3")
    (model / "config.json").write_text(json.dumps(PHI3))
    return model


def test_a_model_newer_than_the_image_exits_2_naming_the_tags_that_serve_it(tmp_path):
    img = Image(tmp_path, "24.05", None)
    result = img.run("prepare", MODEL_ID=str(phi3_checkpoint(tmp_path)))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: Phi3ForCausalLM (model_type phi3) needs TensorRT-LLM 0.10.0 or later for "
        "WORKFLOW=engine (tags 24.06 and later); this image (24.05) has TensorRT-LLM 0.9.0"
    ]
    assert img.builds() == 0 and records(img.records, "convert_checkpoint") == []
    assert not img.cache.exists() and not img.repo.exists()


def test_check_reports_that_the_configured_model_is_not_served(tmp_path):
    img = Image(tmp_path, "24.05", None)
    result = img.run("check", MODEL_ID=str(phi3_checkpoint(tmp_path)), NVIDIA_VISIBLE_DEVICES="all")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["model"]["model"] == "Phi3ForCausalLM (model_type phi3)"
    assert "needs TensorRT-LLM 0.10.0 or later" in report["model"]["problem"]
    assert "tags 24.06 and later" in result.stderr
    ok = Image(tmp_path / "newer", "24.06", None).run("check", MODEL_ID=str(phi3_checkpoint(tmp_path / "newer")))
    assert json.loads(ok.stdout)["model"]["problem"] is None


def test_a_hub_model_is_refused_after_fetching_its_config_alone(tmp_path):
    pytest.importorskip("huggingface_hub")
    hub = FakeHub(
        "microsoft/Phi-3-mini-4k-instruct",
        {"config.json": json.dumps(PHI3).encode(), "model.safetensors": b"weights" * 1000},
    )
    try:
        img = Image(tmp_path, "24.05", None)
        result = img.run(
            "prepare", MODEL_ID="microsoft/Phi-3-mini-4k-instruct", HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1"
        )
    finally:
        hub.close()
    assert result.returncode == 2, result.stderr
    assert "error: Phi3ForCausalLM (model_type phi3) needs TensorRT-LLM 0.10.0" in result.stderr
    assert any("config.json" in request for request in hub.requests), hub.requests
    probe = "HEAD /api/models/microsoft/Phi-3-mini-4k-instruct"  # hub_reach's one probe before the client
    assert not [r for r in hub.requests if "config.json" not in r and r != probe], "only config.json was asked for"
    assert not list(img.cache.rglob("*.safetensors*")), "no weights were downloaded"
    assert img.builds() == 0


def test_flags_reports_each_program_the_plans_run_with_its_missing_flags(image):
    result = image.run("flags")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    programs = {p["program"]: p for p in report["programs"]}
    assert report["tag"] == "25.01" and "examples/llama/convert_checkpoint.py" in programs
    # The doubles on PATH answer --help like the 0.17.0 programs; /opt/tritonserver is not on this host.
    assert programs["trtllm-build"]["missing"] == [] and programs["trtllm-build"]["error"] is None
    assert "--kv_cache_type" in programs["trtllm-build"]["flags"]
    absent = {"tritonserver": f"{contract.TRITONSERVER} is not installed"}
    assert all(p["missing"] == [] and p["error"] is None for name, p in programs.items() if name not in absent)
    assert {name: programs[name]["error"] for name in absent} == absent


ADMIN_KEY = "admin-key-0123456789abcdef"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_admin_key_is_masked_in_prepare_output_logs_and_files(image, tmp_path, log_format):
    (tmp_path / "admin-key").write_text(ADMIN_KEY + "\n")
    result = image.run("prepare", TRITON_ADMIN_KEY_FILE=str(tmp_path / "admin-key"), LOG_FORMAT=log_format)
    assert result.returncode == 0, result.stderr
    assert_secret_nowhere(ADMIN_KEY, image, result)
    argv = json.loads(result.stdout)["argv"]
    apis = "shared-memory,model-repository,statistics,trace,logging"
    assert argv[-2:] == [f"--http-restricted-api={apis}:admin-key=", f"--grpc-restricted-protocol={apis}:admin-key="]
    assert f"--http-restricted-api={apis}:admin-key=***" in result.stderr  # the logged launch command


def test_restricted_apis_none_opens_them_with_a_warning(image):
    result = image.run("prepare", RESTRICTED_APIS="none")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    assert not any(arg.startswith(("--http-restricted", "--grpc-restricted")) for arg in argv), argv
    assert "warning: RESTRICTED_APIS=none: every Triton API" in result.stderr


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


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


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


def test_a_repository_dir_we_did_not_write_is_refused_and_kept(image, tmp_path):
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "todo.txt").write_text("keep me")
    result = image.run("prepare", REPOSITORY_DIR=str(mine))
    assert result.returncode == 2, result.stderr
    assert "was not written by trtllm-entrypoint" in result.stderr
    assert snapshot(mine) == {"notes/todo.txt": b"keep me"} and image.builds() == 0


def test_an_engine_published_by_the_cache_may_be_served_from_it(image):
    engine_dir = json.loads(image.run("build-engine").stdout)["engine_dir"]
    assert Path(engine_dir).parent == image.cache / "engines"
    result = image.run("prepare", ENGINE_DIR=engine_dir)  # inside CACHE_DIR, which build-engine prints: allowed
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["engine_dir"] == engine_dir and image.builds() == 1


def test_a_prebuilt_engine_missing_a_rank_is_refused_before_anything_runs(image):
    engine = image.prebuilt(world_size=2)
    (engine / "rank1.engine").unlink()
    result = image.run("prepare", ENGINE_DIR=str(engine), MODEL_ID="")
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "built for 2 ranks" in error and "rank1.engine" in error
    assert not image.repo.exists() and not records(image.records, "mpirun")


def test_seeds_layout_engine_dir_with_model_id_takes_the_tokenizer_from_the_checkpoint(image):
    engine = without_tokenizer(image.prebuilt())
    result = image.run("prepare", ENGINE_DIR=str(engine))  # MODEL_ID is the checkpoint (fixture)
    assert result.returncode == 0, result.stderr
    assert f'"{image.model}"' in (image.repo / "preprocessing" / "config.pbtxt").read_text()
    assert f'"{engine}"' in (image.repo / "tensorrt_llm" / "config.pbtxt").read_text()


def test_missing_tokenizer_hint_does_not_ask_for_model_id_when_it_is_set(image, tmp_path):
    engine = without_tokenizer(image.prebuilt())
    without_tokenizer(image.model)
    result = image.run("prepare", ENGINE_DIR=str(engine))
    assert result.returncode == 2, result.stderr
    hint = result.stderr.splitlines()[-1]
    assert hint.startswith("hint: ") and "set MODEL_ID" not in hint and "beside the engine" in hint
    assert image.builds() == 0 and not image.repo.exists()


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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


@pytest.mark.parametrize("with_checkpoint", [False, True], ids=["engine alone", "engine and MODEL_ID"])
def test_a_limit_above_the_prebuilt_engine_s_is_refused_before_anything_is_written(image, with_checkpoint):
    model_id = str(image.model) if with_checkpoint else ""
    result = image.run("prepare", ENGINE_DIR=str(image.prebuilt()), MODEL_ID=model_id, MAX_BATCH_SIZE="64")
    assert result.returncode == 2, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert "MAX_BATCH_SIZE=64 is not allowed: expected at most 8" in error
    assert not image.repo.exists() and not image.cache.exists()


def test_templates_dir_may_name_the_inflight_batcher_llm_folder_the_seeds_copy(image):
    result = image.run("prepare", TEMPLATES_DIR=str(image.templates / "inflight_batcher_llm"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in image.repo.iterdir() if p.is_dir()) == [
        "ensemble",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm",
    ]  # and no BLS model unless ENABLE_BLS=true


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


def test_weights_changed_in_place_with_their_mtime_put_back_build_a_new_engine(image):
    assert image.run("prepare").returncode == 0 and image.builds() == 1
    weights = max(image.model.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    before = weights.stat()
    with open(weights, "r+b") as file:  # another model of the same size: bytes changed in the middle
        file.seek(before.st_size // 2)
        file.write(bytes(b ^ 0xFF for b in file.read(16)[:16]))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_size == before.st_size
    result = image.run("prepare")
    assert result.returncode == 0, result.stderr
    assert image.builds() == 2 and len(image.published()) == 2
    again = image.run("prepare")  # unchanged since: the memo answers, nothing is built
    assert again.returncode == 0 and image.builds() == 2


def chown_tree(root: Path, uid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, uid)


def test_what_another_uid_published_is_served_from_this_uids_private_copies(image):
    """The cache entries of another UID (simulated with chown: the tests run as root) could change between the
    check and the load; this UID serves copies of its own, builds nothing, and later starts reuse them."""
    first = image.run("prepare", REPOSITORY_DIR="")
    assert first.returncode == 0, first.stderr
    shared = json.loads(first.stdout)
    engine, repo = Path(shared["engine_dir"]), Path(shared["repository"])
    uid = os.geteuid()
    chown_tree(repo, 1001)
    own_repo = image.run("prepare", REPOSITORY_DIR="")
    assert own_repo.returncode == 0, own_repo.stderr
    assert json.loads(own_repo.stdout)["repository"] == f"{repo}.uid{uid}"
    chown_tree(engine, 1001)
    second = image.run("prepare", REPOSITORY_DIR="")
    assert second.returncode == 0, second.stderr
    private = json.loads(second.stdout)
    # The repository names the engine it serves, so it is another (this UID's) repository too.
    assert private["engine_dir"] == f"{engine}.uid{uid}" and Path(private["repository"]).stat().st_uid == uid
    assert image.builds() == 1, "replicas of different UIDs still build once"
    assert "copying the engine privately" in second.stderr
    for path in [Path(private["engine_dir"]), *Path(private["engine_dir"]).rglob("*")]:
        st = path.lstat()
        assert st.st_uid == uid and not st.st_mode & 0o022
    os.chmod(engine, 0o755)
    (engine / "plugin.so").write_bytes(b"planted")  # the other UID changes its entry afterwards
    third = image.run("prepare", REPOSITORY_DIR="")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["engine_dir"] == private["engine_dir"]
    assert not (Path(private["engine_dir"]) / "plugin.so").exists()
    assert "copying" not in third.stderr and image.builds() == 1


def test_what_we_publish_is_writable_by_this_uid_alone(image):
    os.umask(0o002)  # the arbitrary-UID pattern with GID 0 makes files group-writable
    try:
        result = image.run("prepare", REPOSITORY_DIR="")
    finally:
        os.umask(0o022)
    assert result.returncode == 0, result.stderr
    prepared = json.loads(result.stdout)
    for root in (Path(prepared["engine_dir"]), Path(prepared["repository"])):
        assert all(not p.lstat().st_mode & 0o022 for p in [root, *root.rglob("*")]), root


def complete_repository(root: Path) -> Path:
    (root / "model" / "1").mkdir(parents=True)
    (root / "model" / "config.pbtxt").write_text('name: "model"\nbackend: "python"\n')
    return root


def test_a_typed_command_serving_a_complete_repository_gets_its_restriction_completed(tmp_path, monkeypatch):
    from trtllm_entrypoint import launch, main

    ran = []
    monkeypatch.setattr(launch, "exec_argv", lambda argv, env: ran.append(argv) or sys.exit(0))
    repo = complete_repository(tmp_path / "repo")
    typed = ["tritonserver", f"--model-repo={repo}", "--http-restricted=logging:admin-key=K-0123456789abcdef"]
    with pytest.raises(SystemExit):
        main.run(typed, {})
    assert ran == [[*typed, "--grpc-restricted-protocol=logging:admin-key=K-0123456789abcdef"]]
    with pytest.raises(UsageError, match="--allow-sagemaker=true"):  # a restricted server gets no side door
        main.run([*typed, "--allow-sagemaker=true"], {})
    ran.clear()
    with pytest.raises(SystemExit):  # no restriction at all: as typed, the user's own open server
        main.run(["tritonserver", f"--model-repo={repo}", "--allow-sagemaker=true"], {})
    assert len(ran) == 1


def test_a_routine_start_logs_only_the_parameters_the_user_set_and_check_lists_every_one(image):
    quiet = image.run("prepare", KV_CACHE_FREE_GPU_MEM_FRACTION="0.5")
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stderr.splitlines()
    (summary,) = [line for line in lines if "template parameters" in line]
    assert "kv_cache_free_gpu_mem_fraction=0.5" in summary and "backend_defaults=" in summary
    assert "unset (backend default)" not in quiet.stderr and "batching_strategy" not in summary
    # The engine build's command lines and the launch command are for LOG_LEVEL=debug.
    assert not [line for line in lines if "running" in line and "--checkpoint_dir" in line]
    # Another engine, so that it is built again, this time with the verbose log.
    verbose = image.run("prepare", KV_CACHE_FREE_GPU_MEM_FRACTION="0.5", MAX_BEAM_WIDTH="2", LOG_LEVEL="debug")
    assert "debug: optional template parameters" in verbose.stderr and "batching_strategy=" in verbose.stderr
    assert "debug: running step=trtllm-build command=trtllm-build --checkpoint_dir" in verbose.stderr
    report = json.loads(image.run("check", KV_CACHE_FREE_GPU_MEM_FRACTION="0.5").stdout)
    parameters = report["template_parameters"]
    assert parameters["kv_cache_free_gpu_mem_fraction"] == "0.5"
    assert parameters["batching_strategy"] == "inflight_fused_batching"
    assert parameters["max_attention_window_size"] == "unset (backend default)"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_hub_download_logs_its_progress_and_a_summary_without_bars_or_secrets(tmp_path, log_format):
    pytest.importorskip("huggingface_hub")
    token = "hf_progressDoNotLeak0123456789"
    model = tiny_llama(tmp_path / "source")
    files = {path.name: path.read_bytes() for path in sorted(model.iterdir())}
    hub = FakeHub("org/tiny-llama", files, seconds_per_file=2.5)
    try:
        img = Image(tmp_path / "image", "25.01", templates_for("v0.17.0"))
        result = img.run(
            "prepare",
            MODEL_ID="org/tiny-llama",
            HF_ENDPOINT=hub.url,
            HF_TOKEN=token,
            HF_HUB_DISABLE_TELEMETRY="1",
            PROGRESS_INTERVAL_SECS="1",
            LOG_FORMAT=log_format,
        )
    finally:
        hub.close()
    assert result.returncode == 0, result.stderr
    assert any(h.get("authorization") == f"Bearer {token}" for h in hub.headers), "the token was sent to the hub"
    assert token not in result.stderr + result.stdout and "\r" not in result.stderr
    lines = result.stderr.splitlines()
    if log_format == "json":
        events = [json.loads(line) for line in lines]
    else:
        events = [
            {"msg": line.split(": ", 1)[1].split(" repo_id=")[0], **dict(re.findall(r" (\w+)=(\S+)", line))}
            for line in lines
            if " repo_id=" in line
        ]
    progress = [e for e in events if e["msg"] == "downloading" and "percent" in e]
    assert len(progress) >= 2, lines
    for event in progress:
        done, total = str(event["files"]).split("/")
        assert total == str(len(files)) and 0 <= int(done) <= len(files)
        assert str(event["bytes"]).endswith(f"/{sum(map(len, files.values())) / 1000:.1f}KB")
        assert 0 <= float(event["percent"]) <= 100 and str(event["rate"]).endswith("/s") and "elapsed_s" in event
    assert [float(e["percent"]) for e in progress] == sorted(float(e["percent"]) for e in progress)
    (summary,) = [e for e in events if e["msg"] == "download done"]
    assert str(summary["files"]) == str(len(files)) and float(summary["seconds"]) >= 2
    # The downloaded weights are what was built: the engine workflow ran on the fetched snapshot.
    assert img.builds() == 1
