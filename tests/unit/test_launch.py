import os
from pathlib import Path

import pytest

from harness.image_data import FACTS, image_facts
from tests import factories
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import supervise
from trtllm_entrypoint.launch.plan import LaunchPlan, Located, decide_serve_plan
from trtllm_entrypoint.model.locate import ModelSource
from trtllm_entrypoint.openai.plan import FrontPlan

REPO = Path("/tmp/trtllm-model-repository")
TS = contract.TRITONSERVER


def make_settings(**env):
    return factories.settings(**env)


def rank0(prefix="prefix0_"):
    return [
        TS,
        f"--model-repository={REPO}",
        "--exit-timeout-secs=30",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
    ]


def worker(rank):
    return [
        TS,
        f"--model-repository={REPO}",
        "--exit-timeout-secs=30",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        "--load-model=tensorrt_llm",
    ]


def test_world_size_1_is_a_single_tritonserver():
    assert launch.server_argv(make_settings(), FACTS, REPO, 1, uid=1000) == rank0()


@pytest.mark.parametrize("world_size", [2, 4])
def test_multi_gpu_runs_one_rank_per_gpu_under_mpirun(world_size):
    argv = launch.server_argv(make_settings(TP_SIZE=str(world_size)), FACTS, REPO, world_size, uid=1000)
    expected = ["mpirun", "-n", "1"] + rank0()
    for rank in range(1, world_size):
        expected += [":", "-n", "1"] + worker(rank)
    assert argv == expected
    assert argv.count(TS) == world_size and argv[-1] != ":"


def test_root_needs_allow_run_as_root():
    argv = launch.server_argv(make_settings(TP_SIZE="2"), FACTS, REPO, 2, uid=0)
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert "--allow-run-as-root" not in launch.server_argv(make_settings(TP_SIZE="2"), FACTS, REPO, 2, uid=1)


def test_only_rank_0_binds_ports_and_gets_triton_args():
    settings = make_settings(
        TP_SIZE="2",
        HTTP_PORT="8080",
        GRPC_PORT="9001",
        METRICS_PORT="9102",
        TRITON_ARGS="--log-verbose=1 --model-control-mode=poll",
    )
    argv = launch.server_argv(settings, FACTS, REPO, 2, uid=1000)
    first, second = argv[argv.index("-n") + 2 : argv.index(":")], argv[argv.index(":") + 3 :]
    assert first[-5:] == [
        "--http-port=8080",
        "--grpc-port=9001",
        "--metrics-port=9102",
        "--log-verbose=1",
        "--model-control-mode=poll",
    ]
    assert not any(a.startswith(("--http-port", "--grpc-port", "--metrics-port", "--log-verbose")) for a in second)


def test_triton_args_and_ports_for_a_single_server():
    settings = make_settings(
        TRITON_ARGS="--log-verbose=1 --strict-readiness=true",
        EXIT_TIMEOUT_SECS="120",
        HTTP_PORT="8080",
        GRPC_PORT="9000",
        OPENAI_PORT="9100",
    )
    argv = launch.server_argv(settings, FACTS, REPO, 1, uid=1000)
    assert "--exit-timeout-secs=120" in argv and "--http-port=8080" in argv and "--grpc-port=9000" in argv
    assert argv[-2:] == ["--log-verbose=1", "--strict-readiness=true"]


def test_llmapi_is_one_server_with_auto_complete():
    settings = make_settings(WORKFLOW="llmapi", TP_SIZE="4")
    argv = launch.server_argv(settings, FACTS, REPO, 4, uid=0)
    assert argv[0] == TS and "mpirun" not in argv
    assert "--disable-auto-complete-config" not in argv  # model.py fills max_batch_size/decoupled from model.yaml


def openai_settings(facts=FACTS, **env):
    return factories.settings(facts, FRONTEND="openai", **env)


@pytest.mark.parametrize(
    "tag,workflow", [(tag, wf) for tag in ("24.04", "25.01", "26.07") for wf in image_facts(tag).workflows]
)
def test_openai_runs_tritonserver_as_triton_mode_does_plus_the_front(tag, workflow):
    facts = image_facts(tag)
    settings = openai_settings(facts, WORKFLOW=workflow, TRITON_ADMIN_KEY="k" * 20, RESTRICTED_APIS="inference")
    triton = factories.settings(facts, WORKFLOW=workflow, TRITON_ADMIN_KEY="k" * 20, RESTRICTED_APIS="inference")
    repo = Path("/repo")
    argv = launch.server_argv(settings, facts, repo, 1, uid=1000)
    assert argv == launch.server_argv(triton, facts, repo, 1, uid=1000)  # the same tritonserver, restrictions too
    assert any(a.startswith("--http-restricted-api=inference:") for a in argv)
    # The front: one command for every worker, everything else in its environment (its plan, the admin key).
    assert launch.front_argv("/py") == ["/py", "-m", "trtllm_entrypoint.openai"]
    checkpoint = ModelSource("checkpoint", Path("/models/m"), None, None, False)
    plan = decide_serve_plan(settings, Located(checkpoint, tokenizer=Path("/tok")))
    front = LaunchPlan(plan=plan, facts=facts, repository=repo, engine_dir=None).front
    assert front is not None
    # The engine workflow's front asks the tensorrt_llm model with token ids; the llmapi model is the entry model.
    asked = "tensorrt_llm" if workflow == "engine" else contract.ENTRY_MODEL[workflow]
    assert (front.config, front.restricted, front.workflow, front.entry_model) == (
        f"{repo}/{asked}/config.pbtxt",
        ("inference",),
        workflow,
        asked,
    )
    assert front.add_special_tokens and front.skip_special_tokens  # as upstream's pre/postprocessing models
    assert front.triton_url == f"http://127.0.0.1:{settings.http_port}"
    assert front.max_seq_len == settings.max_seq_len  # a chat answer's default room
    env = supervise.front_environ({}, settings.admin_key, front)
    assert FrontPlan.from_json(env[contract.FRONT_PLAN_VARIABLE]) == front
    assert env[contract.FRONT_KEY_VARIABLE] == "k" * 20 and "k" * 20 not in front.to_json()
    assert settings.decoupled  # streaming follows from the front
    if workflow == "engine":  # several GPUs: the ranks under mpirun, as in Triton mode; the front stays one command
        assert launch.server_argv(settings, facts, repo, 2, uid=1000)[0] == "mpirun"


def test_openai_refuses_decoupled_false_and_takes_true():
    with pytest.raises(UsageError, match="DECOUPLED=false cannot serve FRONTEND=openai") as refused:
        openai_settings(DECOUPLED="false")
    assert "leave DECOUPLED unset" in refused.value.hint
    assert openai_settings(DECOUPLED="true").decoupled
    assert not make_settings().decoupled  # Triton mode keeps its default


def test_front_workers_follow_the_cpus_unless_set(monkeypatch):
    from trtllm_entrypoint.config import cpus

    assert [cpus.default_front_workers(n) for n in (1, 2, 15, 16, 24, 64, 128)] == [1, 1, 1, 2, 3, 8, 8]
    assert openai_settings(OPENAI_WORKERS="3").openai_workers == 3
    with pytest.raises(UsageError, match="OPENAI_WORKERS"):
        openai_settings(OPENAI_WORKERS="0")


def test_world_size_below_1_is_refused():
    with pytest.raises(UsageError, match="world size"):
        launch.server_argv(make_settings(), FACTS, REPO, 0, uid=1000)


KSERVE = ["tritonserver", "--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080", "--allow-grpc=true"]


def test_passthrough_parses_the_kserve_command_line():
    given = launch.parse_passthrough(KSERVE)
    assert given.repository == Path("/mnt/models")
    assert (given.http_port, given.grpc_port, given.metrics_port) == (8080, 9000, None)


def test_passthrough_parses_separate_values():
    given = launch.parse_passthrough(
        ["tritonserver", "--model-repository", "/repo", "--http-port", "8000", "--metrics-port", "9102"]
    )
    assert (given.repository, given.http_port, given.metrics_port) == (Path("/repo"), 8000, 9102)


def test_passthrough_with_several_or_no_repositories_has_none():
    assert launch.parse_passthrough(["tritonserver", "--model-repository=/a", "--model-store=/b"]).repository is None
    assert launch.parse_passthrough(["tritonserver", "--help"]).repository is None


@pytest.mark.parametrize("port", ["²", "٨٠٠٠"])
def test_passthrough_port_of_non_ascii_digits_is_a_usage_error_not_a_traceback(port):
    with pytest.raises(UsageError, match="is not a port number"):
        launch.parse_passthrough(["tritonserver", f"--http-port={port}"])


def test_passthrough_bad_port_is_a_usage_error():
    with pytest.raises(UsageError, match="--http-port='80a'"):
        launch.parse_passthrough(["tritonserver", "--http-port=80a"])


def test_rewrite_replaces_only_the_repository():
    assert launch.rewrite_repository(KSERVE, Path("/tmp/repo")) == [
        "tritonserver",
        "--model-store=/tmp/repo",
        "--grpc-port=9000",
        "--http-port=8080",
        "--allow-grpc=true",
    ]
    assert launch.rewrite_repository(
        ["tritonserver", "--model-repository", "/mnt/models", "--log-verbose=1"], Path("/tmp/repo")
    ) == ["tritonserver", "--model-repository", "/tmp/repo", "--log-verbose=1"]


def test_rewrite_needs_exactly_one_repository():
    with pytest.raises(EntrypointError, match="found 0"):
        launch.rewrite_repository(["tritonserver", "--http-port=1"], Path("/x"))


def test_exec_argv_replaces_the_process_with_the_given_environment(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execvpe", lambda file, args, env: calls.append((file, args, env)))
    launch.exec_argv(["tritonserver", "--model-repository=/r"], {"PATH": "/opt/tritonserver/bin", "A": "1"})
    assert calls == [
        ("tritonserver", ["tritonserver", "--model-repository=/r"], {"PATH": "/opt/tritonserver/bin", "A": "1"})
    ]


def test_exec_argv_missing_program_is_a_clear_error(tmp_path):
    with pytest.raises(EntrypointError, match="cannot run no-such-tritonserver: not found"):
        launch.exec_argv(["no-such-tritonserver"], {"PATH": str(tmp_path)})


def test_tags_whose_triton_has_the_first_response_histogram_get_it_before_the_users_arguments():
    import dataclasses

    facts = dataclasses.replace(FACTS, features=("triton_histogram_latencies",))
    argv = launch.server_argv(
        make_settings(TRITON_ARGS="--metrics-config=summary_latencies=true"), facts, REPO, 2, uid=1
    )
    flag = "--metrics-config=histogram_latencies=true"
    assert argv.count(flag) == 1 and argv.index(flag) < argv.index("--metrics-config=summary_latencies=true")
    assert argv.index(flag) < argv.index(":")  # rank 0 only: the other ranks serve no metrics
    assert flag not in launch.server_argv(make_settings(), FACTS, REPO, 1, uid=1)  # 24.10 and before have none
    assert flag in launch.server_argv(make_settings(), image_facts("24.11"), REPO, 1, uid=1)
    assert flag not in launch.server_argv(make_settings(), image_facts("24.10"), REPO, 1, uid=1)
