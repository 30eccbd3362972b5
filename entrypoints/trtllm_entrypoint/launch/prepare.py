"""The serve pipeline's execute step up to the exec: the engine, the filled repository and the command line of a
decided plan (`Prepared`), which `serve` runs and `prepare` prints; a multi-node group's mpirun and rank options."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trtllm_entrypoint.config import gpu
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.engine import config as engine_config
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import group, lora, preflight, ready, security, serve_files
from trtllm_entrypoint.launch import plan as serve_plan
from trtllm_entrypoint.launch.health import health_url
from trtllm_entrypoint.launch.plan import LaunchPlan, ServePlan
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.storage import paths


@dataclass(frozen=True)
class Prepared:
    """The plan, executed up to the exec: `serve` runs `argv`, `prepare` prints all of it."""

    launch: LaunchPlan
    argv: list[str]
    ready: dict[str, object]  # the fields of the line logged once the server answers readiness
    front: list[str] | None = None  # one worker of the OpenAI front when the plan has one (supervise.py runs them)

    @property
    def plan(self) -> ServePlan:
        return self.launch.plan

    def to_json(self) -> str:
        return json.dumps(
            {
                "argv": self.argv,
                "repository": str(self.launch.repository),
                "engine_dir": str(self.launch.engine_dir) if self.launch.engine_dir else None,
                "health_url": health_url(self.plan.health_port, self.plan.health_path),
                "front": None
                if self.front is None or self.launch.front is None
                else {
                    "argv": self.front,
                    "workers": self.launch.front.workers,
                    "plan": json.loads(self.launch.front.to_json()),  # what each worker reads from its environment
                },
                "plan": self.launch.describe(),
                "ready": self.ready,
            },
            indent=2,
        )


def ssh_files() -> group.SshFiles:
    """In this process's private state directory: ssh takes the group's key only from a directory of this UID."""
    return group.SshFiles(paths.state_dir() / "mpi-ssh")


def prepare(
    plan: ServePlan,
    facts: ImageFacts,
    env: Mapping[str, str],
    log: Log,
    *,
    need_gpu: bool,
    pod_group: group.Group | None = None,
) -> Prepared:
    """Everything but the exec: the engine, the repository and the command line."""
    settings = plan.settings
    gpus = functools.lru_cache(maxsize=None)(functools.partial(gpu.detect_gpus, settings.gpu_visibility))
    if not plan.fills_repository:
        log.info(
            "model is a complete Triton model repository; serving it as given (its code is yours, not "
            "compared with the image's)",
            repository=plan.repository,
        )
        given = LaunchPlan(plan=plan, facts=facts, repository=plan.repository, engine_dir=None)
        return finish(given, log)
    if plan.engine == "cache" or not settings.repository_dir:
        serve_files.warn_open_cache(settings.cache_dir, log)
    # Before any build: an engine for more GPUs than this node (or group) has would never serve here.
    mpi_options: list[str] = []
    rank_options: list[str] = []
    if pod_group is not None:
        # Each pod runs its share of the ranks on its own GPUs; the leader's mpirun places them all.
        per_pod = group.ranks_per_pod(plan.world_size, pod_group, gpus().count)
        if need_gpu:
            gpu.require_gpus(gpus(), per_pod[pod_group.index], "this pod's ranks")
        mpi_options = group.mpirun_options(pod_group, per_pod, ssh_files())
        rank_options = group.rank_options(env)
    elif need_gpu:
        gpu.require_gpus(gpus(), plan.world_size, "to serve the model")
    engine_dir = None if plan.engine == "none" else serve_files.ensure_engine(plan, facts, env, log, gpus)
    if plan.engine == "cache" and engine_dir is not None:
        # Its key holds what was asked; its own record, read once it exists, says what it was built with.
        plan = serve_plan.with_engine(plan, engine_config.read(engine_dir))
    if plan.taken:
        log.info("serving the limits the engine was built with", **plan.taken)
    lora_values = lora.fill_values(plan, facts, env, log)  # the adapters converted for the engine, once per set
    with log.phase("fill"):
        guided_values, guided_off = serve_files.guided_decoding(plan, facts, log)
        repo = serve_files.write_repository(plan, facts, log, engine_dir, {**lora_values, **guided_values})
    resolved = LaunchPlan(
        guided_off=guided_off,
        plan=plan,
        facts=facts,
        repository=repo,
        engine_dir=engine_dir,
        mpi_options=tuple(mpi_options),
        rank_options=tuple(rank_options),
    )
    return finish(resolved, log)


def finish(resolved: LaunchPlan, log: Log) -> Prepared:
    argv = serve_plan.launch_argv(resolved)
    front = None if resolved.front is None else launch.front_argv(sys.executable or "python3")
    for warning in security.start_warnings(resolved.settings, resolved.facts, resolved.front):
        log.warn(warning)
    if resolved.front is not None and not preflight.has_chat_template(Path(resolved.front.tokenizer)):
        # Base models have none: completions serve, and chat answers 400 naming /v1/completions instead.
        log.warn(
            "the tokenizer has no chat_template: /v1/completions serves, /v1/chat/completions answers 400",
            tokenizer=resolved.front.tokenizer,
        )
    return Prepared(launch=resolved, argv=argv, ready=ready.summary(resolved), front=front)
