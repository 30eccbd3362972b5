"""What will be served and how, decided once: a pure function of the settings, the located model and the image facts.

`main` locates the model (`Located`: what was read about it, each fact once), then `decide_serve_plan` makes the
ServePlan: for a prebuilt engine its own parallelism and limits are taken there, so the plan is final before anything
runs.
`main` executes it (download, engine from the cache, repository fill) into a LaunchPlan, which adds only what
executing made: paths, the tokenizer, mpirun's placement (a cached engine's own record, read once it exists, completes
the plan the same way). `launch_argv` turns that alone into the command line, and `prepare` prints it. Nothing here
reads the environment, runs a program or writes a file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.config.records import EngineSpec
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.engine.config import BuiltEngine
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import security
from trtllm_entrypoint.model import name as model_name
from trtllm_entrypoint.model.adapters import Adapter
from trtllm_entrypoint.model.locate import ModelSource
from trtllm_entrypoint.model.support import Converter
from trtllm_entrypoint.openai.plan import FrontPlan
from trtllm_entrypoint.repository import fill
from trtllm_entrypoint.repository.parameters import BACKEND_DEFAULTS

# How the engine is had: none is needed (llmapi, or a complete repository), the model is one, or the cache holds the
# one these settings build (built into it, under its lock, when it does not yet).
Engine = Literal["none", "prebuilt", "cache"]


@dataclass(frozen=True)
class Located:
    """The model once resolved, with what was read about it, each fact once."""

    source: ModelSource  # what is served as is, or built and served from
    built: BuiltEngine | None = None  # a prebuilt engine's config.json
    # MODEL_ID's own directory when it names one; beside ENGINE_DIR that is its second role: where the tokenizer
    # lives (the seeds' layout). Its other role there, what a stale engine is rebuilt from, becomes `source` instead.
    model_dir: Path | None = None
    converter: Converter | str | None = None  # a checkpoint's converter in this image (models.json), or why none
    # Where the pre/postprocessing models (and the OpenAI front) find the tokenizer: found and checked before any
    # build (preflight.tokenizer_dir); None for a complete repository, which brings its own.
    tokenizer: Path | None = None
    # LORA_DIR's adapters, read and checked (launch/lora.py), and the engine flags they need.
    adapters: tuple[Adapter, ...] = ()
    lora_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServePlan:
    settings: Settings  # as served: the workflow is the plan's, and a prebuilt engine's parallelism and limits
    model: ModelSource  # what is served as is, or built and served from
    engine: Engine
    world_size: int  # ranks: a built engine's own, else TP_SIZE x PP_SIZE (which a cached engine's key holds)
    repository: Path  # the given repository, REPOSITORY_DIR, or the cache's (content-named below it)
    health_port: int  # where `health` asks whether the server is ready
    health_path: str  # and on which route (contract.READY_PATHS)
    typed_argv: tuple[str, ...] = ()  # a typed `tritonserver …` command: kept, with only its repository replaced
    notes: tuple[str, ...] = ()  # how the plan departs from the settings, for the log
    taken: Mapping[str, int] = field(default_factory=dict)  # what the engine's config.json decided, for the log
    converter: Converter | str | None = None  # as Located's: what a cached engine is built with
    model_dir: Path | None = None  # as Located's
    tokenizer: Path | None = None  # as Located's
    adapters: tuple[Adapter, ...] = ()  # as Located's: what the model serves beside the base

    @property
    def workflow(self) -> str:
        return self.settings.workflow

    @property
    def fills_repository(self) -> bool:
        return self.model.kind != "repository"

    def describe(self) -> dict[str, object]:
        return {
            "workflow": self.workflow,
            "model": {"kind": self.model.kind, "path": _text(self.model.path), "repo_id": self.model.repo_id},
            "engine": self.engine,
            "repository": str(self.repository),
            "health_port": self.health_port,
            "health_path": self.health_path,
            "typed_argv": list(self.typed_argv) or None,
        }


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def decide_serve_plan(settings: Settings, located: Located, typed_argv: tuple[str, ...] = ()) -> ServePlan:
    """The one decision of what is served: workflow, engine, repository, where readiness is asked, and a
    prebuilt engine's own parallelism and limits (a set value the engine cannot honour is refused here)."""
    model = located.source
    notes: list[str] = []
    workflow = settings.workflow
    if model.kind == "engine" and workflow == "llmapi":
        if "workflow" in settings.explicit:
            raise UsageError(
                f"WORKFLOW=llmapi cannot serve the prebuilt engine at {model.path}",
                "set WORKFLOW=engine, or give MODEL_ID a Hugging Face checkpoint",
            )
        notes.append("the model is a prebuilt engine: using the engine workflow (this image's default is llmapi)")
        workflow = "engine"
    settings = dataclasses.replace(settings, workflow=workflow, lora_flags=located.lora_flags)
    if settings.frontend == "openai" and model.kind == "repository":
        raise UsageError(
            f"FRONTEND=openai serves the repositories the entrypoint fills, not the complete one at {model.path}",
            "set FRONTEND=triton for a repository of your own, or give MODEL_ID a checkpoint or engine",
        )
    if settings.frontend == "openai" and located.tokenizer is None:  # the front renders prompts with it
        raise UsageError("FRONTEND=openai needs the model's tokenizer, and none was found", "set MODEL_ID")
    engine: Engine
    if model.kind == "repository" and model.path is not None:  # a repository is always local
        engine, repository = "none", model.path
    else:
        engine = "prebuilt" if model.kind == "engine" else "cache" if workflow == "engine" else "none"
        repository = settings.repository_dir or settings.cache.repositories
    plan = ServePlan(
        settings=settings,
        model=model,
        engine=engine,
        repository=repository,
        # With FRONTEND=openai, the front's readiness: it answers ready once tritonserver does.
        health_port=settings.openai_port if settings.frontend == "openai" else settings.http_port,
        health_path=contract.READY_PATHS[settings.frontend],
        typed_argv=typed_argv,
        notes=tuple(notes),
        world_size=settings.world_size,
        converter=located.converter,
        model_dir=located.model_dir,
        tokenizer=located.tokenizer,
        adapters=located.adapters,
    )
    return plan if engine != "prebuilt" or located.built is None else with_engine(plan, located.built)


def with_engine(plan: ServePlan, built: BuiltEngine) -> ServePlan:
    """The plan served by `built`: its ranks, and its parallelism and limits where the user set none."""
    settings, taken = engine_config.serving_settings(plan.settings, built)
    return dataclasses.replace(plan, settings=settings, world_size=built.world_size, taken=taken)


@dataclass(frozen=True)
class LaunchPlan:
    """The ServePlan once executed up to the exec: everything the command line is made of, final."""

    plan: ServePlan  # final: a cached engine's own record taken
    facts: ImageFacts = field(repr=False)
    repository: Path  # the filled one, or the complete one given
    engine_dir: Path | None
    mpi_options: tuple[str, ...] = ()  # where mpirun puts the ranks when they span a group's pods
    rank_options: tuple[str, ...] = ()  # what each of those ranks gets (its environment)
    guided_off: str = ""  # why the served model takes no guided decoding guide ("" when it does: serve_files)

    @property
    def settings(self) -> Settings:
        return self.plan.settings

    @property
    def tokenizer(self) -> Path | None:
        return self.plan.tokenizer

    @property
    def front(self) -> FrontPlan | None:
        """FRONTEND=openai: what every worker of the OpenAI front runs with (None: Triton's own endpoints alone)."""
        return front_plan(self.plan, self.repository, self.guided_off)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def describe(self) -> dict[str, object]:
        s = self.settings
        restriction = security.restriction(s, self.facts)
        return {
            **self.plan.describe(),
            "repository": str(self.repository),
            "engine_dir": _text(self.engine_dir),
            "tokenizer": _text(self.tokenizer),
            "world_size": self.world_size,
            "engine_spec": {f.name: getattr(s, f.name) for f in dataclasses.fields(EngineSpec)},
            "taken_from_engine": dict(self.plan.taken),
            "frontend": s.frontend,
            "restricted_apis": list(restriction.apis) if restriction.supported else [],
            "front": None if self.front is None else dataclasses.asdict(self.front),
        }


def launch_argv(launch_plan: LaunchPlan) -> list[str]:
    """The command that serves the final plan."""
    p = launch_plan
    argv = launch.server_argv(
        p.settings,
        p.facts,
        p.repository,
        p.world_size,
        mpi_options=p.mpi_options,
        rank_options=p.rank_options,
    )
    if p.plan.typed_argv and Path(argv[0]).name == "tritonserver":
        # One rank: the command as typed, with only its model repository replaced (and the APIs restricted).
        restrict = security.restriction(p.settings, p.facts).argv()
        return launch.rewrite_repository(p.plan.typed_argv, p.repository) + restrict
    return argv


def front_plan(plan: ServePlan, repository: Path, guided_off: str = "") -> FrontPlan | None:
    """The OpenAI front's plan (FRONTEND=openai), else None; pure, and it cannot fail: decide_serve_plan refused
    what the front cannot serve (a complete repository, no tokenizer) before anything was built."""
    s = plan.settings
    if s.frontend != "openai" or plan.tokenizer is None:
        return None
    # The engine workflow's front asks the tensorrt_llm model itself with token ids, tokenizing and decoding as the
    # pre/postprocessing models would (no Python stub on its path: docs/openai.md); the llmapi model takes text.
    entry = contract.IDS_MODEL.get(plan.workflow, fill.served_name(s, plan.workflow))
    return FrontPlan(
        host="0.0.0.0",  # every address of the container, as tritonserver's own endpoints
        port=s.openai_port,
        workers=s.openai_workers,
        triton_url=f"http://127.0.0.1:{s.http_port}",
        # What clients send: the model's own name (vLLM's and NIM's), or SERVED_MODEL_NAME.
        served_name=model_name.served_name(s.served_model_name, s.model_id, plan.model, plan.model_dir),
        entry_model=entry,  # the Triton model the front asks
        workflow=plan.workflow,
        config=str(repository / entry / "config.pbtxt"),
        tokenizer=str(plan.tokenizer),
        add_special_tokens=BACKEND_DEFAULTS["add_special_tokens"] == "true",
        skip_special_tokens=BACKEND_DEFAULTS["skip_special_tokens"] == "true",
        restricted=security.front_restricted(s),
        max_seq_len=s.max_seq_len,
        shutdown_timeout=float(s.exit_timeout_secs),
        log_format=s.log_format,
        max_generations=s.openai_max_generations,
        adapters={a.name: a.task_id for a in plan.adapters},
        tool_parser=s.tool_call_parser,
        guided_off=guided_off,
    )
