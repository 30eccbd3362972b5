"""What will be served and how, decided once: a pure function of the settings, the located model and the image facts.

`main` executes the plan (download, engine from the cache, repository fill) and then runs `launch_argv`; `prepare`
prints it. Nothing here reads the environment, runs a program or writes a file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trtllm_entrypoint import contract, launch, security
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.facts import ImageFacts
from trtllm_entrypoint.settings import Settings
from trtllm_entrypoint.sources import ModelSource

# How the engine is had: none is needed (llmapi, or a complete repository), the model is one, or the cache holds the
# one these settings build (built into it, under its lock, when it does not yet).
ENGINES = ("none", "prebuilt", "cache")


@dataclass(frozen=True)
class ServePlan:
    settings: Settings  # as served: the workflow is the plan's
    model: ModelSource  # what is served as is, or built and served from
    engine: str  # one of ENGINES
    repository: Path  # the given repository, REPOSITORY_DIR, or the cache's (content-named below it)
    env: dict[str, str]  # environment the server gets on top of the container's
    health_port: int  # where `health` asks whether the server is ready
    health_path: str  # and on which route (contract.READY_PATHS)
    typed_argv: tuple[str, ...] = ()  # a typed `tritonserver …` command: kept, with only its repository replaced
    notes: tuple[str, ...] = ()  # how the plan departs from the settings, for the log

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
            "env": self.env,
            "health_port": self.health_port,
            "health_path": self.health_path,
            "typed_argv": list(self.typed_argv) or None,
        }


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def decide(settings: Settings, model: ModelSource, typed_argv: tuple[str, ...] = ()) -> ServePlan:
    """The one decision of what is served: workflow, engine, repository, the server's environment and port."""
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
    settings = dataclasses.replace(settings, workflow=workflow)
    if model.kind == "repository" and model.path is not None:  # a repository is always local
        engine, repository = "none", model.path
    else:
        engine = "prebuilt" if model.kind == "engine" else "cache" if workflow == "engine" else "none"
        repository = settings.repository_dir or settings.cache_dir / "repositories"
    return ServePlan(
        settings=settings,
        model=model,
        engine=engine,
        repository=repository,
        env=launch.server_env(settings),
        # The OpenAI frontend's readiness is on its own port (its KServe frontends are off unless asked for).
        health_port=settings.openai_port if settings.frontend == "openai" else settings.http_port,
        health_path=contract.READY_PATHS[settings.frontend],
        typed_argv=typed_argv,
        notes=tuple(notes),
    )


def launch_argv(
    plan: ServePlan, settings: Settings, facts: ImageFacts, repository: Path, world_size: int, tokenizer: Path | None
) -> list[str]:
    """The command that serves `repository`; `settings` are the plan's with the engine's own limits taken."""
    argv = launch.server_argv(settings, facts, repository, world_size, tokenizer=tokenizer)
    if plan.typed_argv and Path(argv[0]).name == "tritonserver":
        # One rank: the command as typed, with only its model repository replaced (and the APIs restricted).
        return launch.rewrite_repository(plan.typed_argv, repository) + security.restriction(settings, facts).argv()
    return argv
