import os
from pathlib import Path

import pytest

from tests.image_data import FACTS, image_facts
from trtllm_entrypoint import contract, launch, server_args
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.settings import Settings

REPO = Path("/tmp/trtllm-model-repository")
TS = contract.TRITONSERVER


def make_settings(**env):
    return Settings.from_env({"CACHE_DIR": "/var/cache/trtllm", **env}, FACTS)


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
    return Settings.from_env({"CACHE_DIR": "/var/cache/trtllm", "FRONTEND": "openai", **env}, facts)


def test_openai_frontend_engine_workflow_serves_no_kserve_frontends():
    settings = openai_settings(HTTP_PORT="8080", GRPC_PORT="9001", TRITON_ARGS="--uvicorn-log-level=warning")
    argv = launch.server_argv(settings, FACTS, REPO, 2, uid=1000, tokenizer=Path("/models/tok"))
    # 25.05's frontend cannot restrict its routes: nothing to pass; its KServe frontends stay off (secure default).
    assert argv == [
        "python3",
        contract.OPENAI_FRONTEND_MAIN,
        f"--model-repository={REPO}",
        "--tokenizer=/models/tok",
        "--openai-port=9000",
        "--backend=tensorrtllm",
        "--uvicorn-log-level=warning",
    ]
    # TP_SIZE=2 is one process: Triton in-process, TensorRT-LLM spawning its own workers (orchestrator mode).
    assert "mpirun" not in argv and launch.server_env(settings) == {"TRTLLM_ORCHESTRATOR": "1"}


def test_kserve_frontends_beside_the_openai_one_only_when_asked_and_nothing_is_restricted():
    settings = openai_settings(OPENAI_KSERVE_FRONTENDS="true", RESTRICTED_APIS="none", HTTP_PORT="8080")
    argv = launch.server_argv(settings, FACTS, REPO, 1, uid=1000, tokenizer=Path("/tok"))
    assert argv[5:8] == ["--enable-kserve-frontends", "--kserve-http-port=8080", "--kserve-grpc-port=8001"]
    with pytest.raises(UsageError, match=r"OPENAI_KSERVE_FRONTENDS='true' is not allowed: .*RESTRICTED_APIS=none"):
        openai_settings(OPENAI_KSERVE_FRONTENDS="true")
    with pytest.raises(UsageError, match="unless FRONTEND=openai"):
        make_settings(OPENAI_KSERVE_FRONTENDS="true")


@pytest.mark.parametrize(
    "tag,apis,expected",
    [
        ("25.09", None, ["model-repository,metrics"]),  # the default list: model-repository and statistics map
        ("25.09", "inference,model-repository", ["inference,model-repository"]),
        ("25.09", "shared-memory,trace", []),  # nothing the frontend serves
        ("25.09", "none", []),
        ("25.08", None, []),  # r25.08's main.py has no --openai-restricted-api
        ("24.12", None, []),
    ],
)
def test_openai_routes_are_restricted_with_the_admin_key_where_the_frontend_can(tag, apis, expected):
    facts = image_facts(tag)
    key = "k" * 32
    env = {"TRITON_ADMIN_KEY": key, "WORKFLOW": "engine", **({"RESTRICTED_APIS": apis} if apis else {})}
    argv = launch.server_argv(openai_settings(facts, **env), facts, REPO, 1, uid=1000, tokenizer=Path("/tok"))
    flag = [i for i, arg in enumerate(argv) if arg == "--openai-restricted-api"]
    # nargs=3 in r25.09's main.py: the APIs, the header, its value (the same key as tritonserver's restriction).
    assert [argv[i + 1] for i in flag] == expected
    assert all(argv[i + 2 : i + 4] == ["admin-key", key] for i in flag)
    assert ("--openai-restricted-api" in facts.flags["openai_frontend"]) == (tag >= "25.09")


@pytest.mark.parametrize("tag", ["25.05", "25.08", "25.11"])
def test_openai_with_the_llmapi_workflow_is_refused_where_the_frontend_cannot_serve_it(tag):
    with pytest.raises(UsageError) as refused:
        openai_settings(image_facts(tag), WORKFLOW="llmapi", MODEL_ID="org/name")
    assert f"cannot serve WORKFLOW=llmapi in image {tag}" in refused.value.message
    assert "from image 25.12 on" in refused.value.message and "25.12 or later" in refused.value.hint


def test_openai_frontend_serves_no_unrestrictable_kserve_endpoints_while_apis_are_restricted():
    settings = make_settings(FRONTEND="openai", MODEL_ID="org/name")
    argv = launch.server_argv(settings, FACTS, REPO, 1, uid=1000)
    assert not [arg for arg in argv if "kserve" in arg]
    assert server_args.side_doors(argv[2:], {}, "openai") == []


def test_openai_frontend_llmapi_and_tokenizer_fallback():
    facts = image_facts("25.12")
    settings = openai_settings(facts, WORKFLOW="llmapi", MODEL_ID="org/name")
    argv = launch.server_argv(settings, facts, REPO, 1, uid=1000)
    assert "--tokenizer=org/name" in argv and not any(a.startswith("--backend") for a in argv)
    assert launch.server_env(settings) == {}
    assert launch.server_env(make_settings()) == {}


def test_openai_frontend_without_any_tokenizer_is_a_usage_error():
    with pytest.raises(UsageError, match="tokenizer"):
        launch.server_argv(make_settings(FRONTEND="openai"), FACTS, REPO, 1, uid=1000)


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
