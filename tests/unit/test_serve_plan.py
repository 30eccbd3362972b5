"""The serving plan is decided once, from the settings and the located model: no file, program or variable is read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import factories
from trtllm_entrypoint.config.records import CommandLine
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.launch.plan import LaunchPlan, Located, decide_serve_plan, launch_argv
from trtllm_entrypoint.model.locate import ModelSource
from trtllm_entrypoint.openai.plan import FrontPlan

# An image whose TensorRT-LLM deprecates engines: llmapi is its default workflow.
FACTS = factories.image_facts(
    tag="25.10",
    tensorrt_llm="1.0.0",
    tensorrt=None,
    triton=None,
    workflows=("engine", "llmapi"),
    engine_deprecated=True,
    openai_frontend=True,
    app_dir=Path("/app"),
    features=("restricted_apis",),
)
CACHE = Path("/cache")


def settings(command_line: CommandLine | None = None, **env: str) -> Settings:
    return factories.settings(FACTS, command_line, CACHE_DIR=str(CACHE), TRITON_ADMIN_KEY="k" * 16, **env)


def model(kind: str, path: str | None = "/models/m") -> Located:
    """A located model; one the entrypoint fills a repository for has its tokenizer beside it."""
    return Located(
        ModelSource(kind=kind, path=Path(path) if path else None, repo_id=None, revision=None, read_only=False),
        tokenizer=Path(path) if path and kind != "repository" else None,
    )


def test_a_checkpoint_is_served_with_the_image_s_default_workflow_and_no_engine():
    plan = decide_serve_plan(settings(), model("checkpoint"))
    assert (plan.workflow, plan.engine, plan.repository) == ("llmapi", "none", CACHE / "repositories")
    assert plan.fills_repository and plan.notes == ()


def test_the_engine_workflow_takes_its_engine_from_the_cache_and_writes_repository_dir():
    plan = decide_serve_plan(settings(WORKFLOW="engine", REPOSITORY_DIR="/repo", HTTP_PORT="8080"), model("checkpoint"))
    assert (plan.workflow, plan.engine, plan.repository, plan.health_port) == ("engine", "cache", Path("/repo"), 8080)


def test_a_prebuilt_engine_switches_a_defaulted_workflow_and_says_so():
    given = settings()
    plan = decide_serve_plan(given, model("engine"))
    assert (plan.workflow, plan.engine) == ("engine", "prebuilt")
    assert plan.notes == ("the model is a prebuilt engine: using the engine workflow (this image's default is llmapi)",)
    assert given.workflow == "llmapi", "the settings as parsed are left alone; the plan carries its own"


def test_a_prebuilt_engine_is_refused_when_llmapi_was_asked_for():
    with pytest.raises(UsageError, match="WORKFLOW=llmapi cannot serve the prebuilt engine at /models/m"):
        decide_serve_plan(settings(WORKFLOW="llmapi"), model("engine"))


def test_a_complete_repository_is_served_where_it_is():
    plan = decide_serve_plan(settings(), model("repository", "/mnt/models"))
    assert (plan.engine, plan.repository, plan.fills_repository) == ("none", Path("/mnt/models"), False)


def test_readiness_is_asked_where_the_frontend_answers_it():
    assert (decide_serve_plan(settings(), model("checkpoint")).health_path) == "/v2/health/ready"
    # The OpenAI frontend answers readiness itself, whether its KServe frontends are off (the default) or not.
    for extra in ({}, {"RESTRICTED_APIS": "none", "OPENAI_KSERVE_FRONTENDS": "true"}):
        plan = decide_serve_plan(
            settings(FRONTEND="openai", WORKFLOW="engine", OPENAI_PORT="9100", **extra), model("checkpoint")
        )
        assert (plan.health_port, plan.health_path) == (9100, "/health/ready"), extra


def test_the_openai_front_is_ready_on_its_port_and_refuses_a_complete_repository():
    plan = decide_serve_plan(settings(FRONTEND="openai", WORKFLOW="engine", OPENAI_PORT="9100"), model("checkpoint"))
    assert (plan.health_port, plan.health_path) == (9100, "/health/ready")
    with pytest.raises(UsageError, match="FRONTEND=openai serves the repositories the entrypoint fills") as refused:
        decide_serve_plan(settings(FRONTEND="openai"), model("repository", "/mnt/models"))
    assert "FRONTEND=triton" in refused.value.hint


def test_the_openai_front_is_one_value_of_the_launch_plan():
    chosen = settings(
        FRONTEND="openai",
        WORKFLOW="engine",
        OPENAI_PORT="9100",
        HTTP_PORT="8100",
        OPENAI_WORKERS="3",
        SERVED_MODEL_NAME="my-llm",
        RESTRICTED_APIS="inference,logging",
        MAX_SEQ_LEN="4096",
        EXIT_TIMEOUT_SECS="7",
    )
    plan = decide_serve_plan(chosen, model("checkpoint"))
    front = LaunchPlan(plan=plan, facts=FACTS, repository=Path("/repo"), engine_dir=Path("/engine")).front
    assert front == FrontPlan(
        host="0.0.0.0",
        port=9100,
        workers=3,
        triton_url="http://127.0.0.1:8100",
        served_name="my-llm",
        entry_model="my-llm",
        workflow="engine",
        config="/repo/my-llm/config.pbtxt",
        tokenizer="/models/m",
        restricted=("inference",),
        max_seq_len=4096,
        shutdown_timeout=7.0,
        max_generations=256,
    )
    assert FrontPlan.from_json(front.to_json()) == front
    default = decide_serve_plan(settings(FRONTEND="openai"), model("checkpoint"))
    default_front = LaunchPlan(plan=default, facts=FACTS, repository=Path("/r"), engine_dir=None).front
    assert default_front is not None
    # Clients send the model's own name (the directory's, /models/m); Triton keeps the entry model's.
    assert (default_front.served_name, default_front.entry_model, default_front.workflow) == (
        "m",
        "tensorrt_llm",
        "llmapi",
    )
    assert default_front.config == "/r/tensorrt_llm/config.pbtxt"
    assert (
        LaunchPlan(
            plan=decide_serve_plan(settings(), model("checkpoint")), facts=FACTS, repository=Path("/r"), engine_dir=None
        ).front
        is None
    )


def test_the_openai_front_without_a_tokenizer_is_refused_when_the_plan_is_decided():
    """Before any engine is built: the front renders prompts with the model's tokenizer."""
    located = Located(ModelSource("checkpoint", Path("/models/m"), None, None, False))
    with pytest.raises(UsageError, match="FRONTEND=openai needs the model's tokenizer"):
        decide_serve_plan(settings(FRONTEND="openai"), located)
    assert decide_serve_plan(settings(), located).tokenizer is None, "Triton's own endpoints alone: no refusal here"


def test_a_typed_tritonserver_command_keeps_its_arguments_with_only_the_repository_replaced():
    typed = ("tritonserver", "--model-store=/mnt/models", "--http-port=8080", "--allow-grpc=true")
    line = CommandLine(server_args=("--allow-grpc=true",), ports={"http_port": 8080}, typed_server=True)
    chosen = settings(line, WORKFLOW="engine", FRONTEND="openai", HTTP_PORT="1")
    plan = decide_serve_plan(chosen, model("engine", "/mnt/models"), typed_argv=typed)
    assert (chosen.frontend, plan.health_port) == ("triton", 8080), (
        "typed ports win; a typed tritonserver has no OpenAI frontend"
    )
    final = LaunchPlan(plan=plan, facts=FACTS, repository=Path("/repo"), engine_dir=Path("/mnt/models"))
    assert final.front is None
    argv = launch_argv(final)
    assert argv[:4] == ["tritonserver", "--model-store=/repo", "--http-port=8080", "--allow-grpc=true"]
    assert [arg.split("=", 1)[0] for arg in argv[4:]] == ["--http-restricted-api", "--grpc-restricted-protocol"]


def test_server_arguments_from_the_command_line_follow_triton_args_and_are_checked_like_them():
    line = CommandLine(server_args=("--log-verbose=1",))
    assert settings(line, TRITON_ARGS="--log-info=true").triton_args == ("--log-info=true", "--log-verbose=1")
    with pytest.raises(UsageError, match="the command line may not contain '--grpc-port'"):
        settings(CommandLine(server_args=("--grpc-port=1",)))
