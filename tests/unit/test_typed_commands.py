"""Commands given to the image (`tritonserver …`, options starting with '-', any other program), the entrypoint in a
real process: run as typed, with a repository filled where one is missing and the API restriction kept.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.image import records
from trtllm_entrypoint.errors import UsageError

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


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


def test_other_commands_run_unchanged_with_their_exit_code(image):
    result = image.run(sys.executable, "-c", "import sys; print('ran', sys.argv[1:]); sys.exit(3)", "x")
    assert result.returncode == 3
    assert result.stdout.strip() == "ran ['x']"


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


def complete_repository(root: Path) -> Path:
    (root / "model" / "1").mkdir(parents=True)
    (root / "model" / "config.pbtxt").write_text('name: "model"\nbackend: "python"\n')
    return root


def test_a_typed_command_serving_a_complete_repository_gets_its_restriction_completed(tmp_path, monkeypatch):
    from trtllm_entrypoint import main
    from trtllm_entrypoint.launch import argv as launch

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
