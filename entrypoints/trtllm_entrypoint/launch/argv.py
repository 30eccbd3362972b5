"""The server command lines (tritonserver, or mpirun with one tritonserver per rank; the OpenAI front's workers) and
the exec.

The server always replaces this process (`os.execvpe`) so that it receives the container's signals and its exit
code is the container's; NVIDIA's launch_triton_server.py backgrounds mpirun and returns, which a container cannot use.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from trtllm_entrypoint import contract
from trtllm_entrypoint.config import server_args
from trtllm_entrypoint.config.server_args import SHM_PREFIX
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.launch import security

if TYPE_CHECKING:
    from trtllm_entrypoint.config.image_facts import ImageFacts
    from trtllm_entrypoint.config.settings import Settings

# The model that ranks other than 0 load: the C++ backend runs the engine on every rank, everything else on rank 0.
RANK_MODEL = "tensorrt_llm"
# Rank 0's metrics options by the capability that names the Triton releases having them: the time to each model's
# first response (nv_inference_first_response_histogram_ms), TTFT for the decoupled models the front streams from.
METRICS_OPTIONS = {"triton_histogram_latencies": "--metrics-config=histogram_latencies=true"}


def _common(settings: Settings, repository: Path, rank: int, auto_complete: bool) -> list[str]:
    argv = [
        contract.TRITONSERVER,
        f"--model-repository={repository}",
        f"--exit-timeout-secs={settings.exit_timeout_secs}",
    ]
    if not auto_complete:
        argv.append("--disable-auto-complete-config")
    # Each rank's Python models need their own shared-memory regions.
    argv.append(f"--backend-config={SHM_PREFIX}=prefix{rank}_")
    return argv


def _ports(settings: Settings) -> list[str]:
    return [
        f"--http-port={settings.http_port}",
        f"--grpc-port={settings.grpc_port}",
        f"--metrics-port={settings.metrics_port}",
    ]


def _worker_rank(settings: Settings, repository: Path, rank: int) -> list[str]:
    """Ranks > 0 serve no endpoint (they would collide with rank 0's ports) and load only the engine model."""
    return _common(settings, repository, rank, auto_complete=False) + [
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        f"--load-model={RANK_MODEL}",
    ]


def tritonserver_argv(
    settings: Settings,
    repository: Path,
    world_size: int,
    uid: int,
    restrict: Sequence[str] = (),
    mpi_options: Sequence[str] = (),
    rank_options: Sequence[str] = (),
    metrics: Sequence[str] = (),
) -> list[str]:
    """`restrict`: the flags that close admin APIs on rank 0's endpoints (security.Restriction.argv); `metrics`: rank
    0's metrics options (before TRITON_ARGS, so a user's own --metrics-config comes later and wins);
    `mpi_options`: where mpirun puts the ranks when they span pods (group.mpirun_options); `rank_options`: what
    each rank's app context gets, the environment for ranks on other pods (group.rank_options)."""
    # The llmapi model reads max_batch_size/decoupled from model.yaml through auto-complete, and starts its own
    # workers for TP/PP; the engine workflow's configs are complete and need one tritonserver per rank.
    llmapi = settings.workflow == "llmapi"
    ranks = 1 if llmapi else world_size
    rank0 = (
        _common(settings, repository, 0, auto_complete=llmapi)
        + _ports(settings)
        + list(restrict)
        + list(metrics)
        + list(settings.triton_args)
    )
    if ranks == 1:
        return rank0
    argv = ["mpirun"] + (["--allow-run-as-root"] if uid == 0 else []) + list(mpi_options)
    argv += ["-n", "1", *rank_options] + rank0
    for rank in range(1, ranks):
        argv += [":", "-n", "1", *rank_options] + _worker_rank(settings, repository, rank)
    return argv


def front_argv(python: str) -> list[str]:
    """One worker of the OpenAI front (supervise.py starts FrontPlan.workers of them). Everything it needs comes in
    its environment (supervise.front_environ): the plan as one value, and the admin key, never on a command line."""
    return [python, "-m", "trtllm_entrypoint.openai"]


def server_argv(
    settings: Settings,
    facts: ImageFacts,
    repository: Path,
    world_size: int,
    *,
    uid: int | None = None,
    mpi_options: Sequence[str] = (),
    rank_options: Sequence[str] = (),
) -> list[str]:
    """The command that serves `repository`. TRITON_ARGS go to the program that serves the endpoints (rank 0)."""
    if world_size < 1:
        raise UsageError(f"world size must be at least 1, got {world_size}", "check TP_SIZE and PP_SIZE")
    return tritonserver_argv(
        settings,
        repository,
        world_size,
        os.geteuid() if uid is None else uid,
        security.restriction(settings, facts).argv(),
        mpi_options,
        rank_options,
        [option for feature, option in METRICS_OPTIONS.items() if feature in facts.features],
    )


@dataclass(frozen=True)
class Passthrough:
    """What a given `tritonserver …` command line asks for, read as tritonserver reads it (`parse_options`)."""

    repositories: tuple[Path, ...]
    http_port: int | None
    grpc_port: int | None
    metrics_port: int | None
    others: tuple[str, ...] = ()  # every other argument, as given
    restriction_keys: tuple[str, ...] = ()  # the keys of its own restriction flags: masked in every log line

    def ports(self) -> dict[str, int]:
        """The ports the command line sets, by Settings field name."""
        return {name: port for name in PORT_FIELDS if (port := getattr(self, name)) is not None}

    @property
    def repository(self) -> Path | None:
        """The model repository when exactly one is given (Triton accepts several)."""
        return self.repositories[0] if len(self.repositories) == 1 else None


PORT_FIELDS = tuple(flag.field for flag in server_args.TRITONSERVER if flag.field)


def parse_passthrough(argv: Sequence[str]) -> Passthrough:
    options = server_args.parse_options(argv[1:])
    repositories = [Path(o.value or "") for o in server_args.found(options, server_args.REPOSITORY_FLAG)]
    ports: dict[str, int | None] = dict.fromkeys(PORT_FIELDS)
    taken: set[int] = set()
    for option in options:
        if option.flag is None or not (option.flag.field or option.flag.option == server_args.REPOSITORY_FLAG):
            continue
        if option.flag.field:
            value = option.value or ""
            if not (value.isascii() and value.isdigit()) or not 0 < int(value) < 65536:
                raise UsageError(f"{option.flag.name}={value!r} is not a port number", "give a number from 1 to 65535")
            ports[option.flag.field] = int(value)
        taken.update(option.indexes())
    others = tuple(arg for i, arg in enumerate(argv[1:]) if i not in taken)
    keys = server_args.restriction_keys(server_args.restriction_values(options))
    return Passthrough(tuple(repositories), **ports, others=others, restriction_keys=tuple(keys))


def rewrite_repository(argv: Sequence[str], new_repository: Path) -> list[str]:
    """The same command line with its one model repository replaced; every other argument is kept as given."""
    argv = list(argv)
    hits = server_args.found(server_args.parse_options(argv[1:]), server_args.REPOSITORY_FLAG)
    if len(hits) != 1:
        raise EntrypointError(f"expected one --model-repository/--model-store in the command line, found {len(hits)}")
    hit = hits[0]
    if hit.value_index == hit.index:
        argv[hit.index + 1] = f"{hit.given}={new_repository}"  # argv[0] is the program
    else:
        argv[hit.index + 2] = str(new_repository)
    return argv


def exec_argv(argv: Sequence[str], environ: Mapping[str, str]) -> NoReturn:
    """Replace this process with argv (looked up on environ's PATH)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], list(argv), dict(environ))
    except FileNotFoundError:
        raise EntrypointError(
            f"cannot run {argv[0]}: not found", "is this a trtllm-images image? check PATH and the program's path"
        ) from None
    except PermissionError:
        raise EntrypointError(f"cannot run {argv[0]}: permission denied") from None
