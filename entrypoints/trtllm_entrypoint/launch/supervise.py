"""The OpenAI front (LaunchPlan.front): one foreground process tree of tritonserver and the OpenAI front's workers.

This process stays (it is the container's main process, under tini) and runs the children: tritonserver as Triton
mode runs it, and OPENAI_WORKERS processes of the front, which share OPENAI_PORT through SO_REUSEPORT. SIGTERM or
SIGINT goes to every child: the front's workers finish their streams and exit, tritonserver drains and exits (its
--exit-timeout-secs). Any child that ends by itself ends the others: the container then exits with that child's
code (tritonserver's when it is the one), so a restart policy restarts all of it and readiness never lies.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from trtllm_entrypoint import contract
from trtllm_entrypoint.openai.plan import FrontPlan
from trtllm_entrypoint.storage import paths

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.2


def front_path_environ(base: Mapping[str, str]) -> dict[str, str]:
    """The container's environment with the front's vendored libraries first on the path: the pure ones and the
    compiled set of this Python, the one that runs the front."""
    compiled = os.path.join(contract.FRONT_DIR, f"py{sys.version_info.major}.{sys.version_info.minor}")
    pure = os.path.join(contract.FRONT_DIR, "any")
    own = [compiled, pure] if os.path.isdir(pure) else []
    path = [*own, base.get("PYTHONPATH", "")]
    extra = {"PYTHONPATH": os.pathsep.join(p for p in path if p)} if any(path) else {}
    return {**base, **extra}


def front_environ(base: Mapping[str, str], key: str, plan: FrontPlan) -> dict[str, str]:
    """The front's environment: front_path_environ's, its plan and the admin key (both read and dropped from its
    environment at start; the key never on a command line)."""
    own_values = {contract.FRONT_PLAN_VARIABLE: plan.to_json(), contract.FRONT_KEY_VARIABLE: key}
    return {**front_path_environ(base), **own_values, "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def metrics_dir() -> Iterator[str]:
    """Where the front's workers keep their metric values (prometheus_client's multiprocess mode), summed by whichever
    worker answers a scrape: in this start's private state directory (storage/paths.py), created empty (a previous
    run's files would add its counts), mode 0700, removed when the front stops."""
    path = Path(tempfile.mkdtemp(prefix="front-metrics-", dir=paths.state_dir()))
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(
    server_argv: Sequence[str],
    front_argv: Sequence[str],
    workers: int,
    server_env: Mapping[str, str],
    front_env: Mapping[str, str],
) -> int:
    """Start them all, wait until one ends or a stop signal comes, stop the rest; the exit code."""
    with metrics_dir() as metrics:
        front_env = {**front_env, contract.FRONT_METRICS_VARIABLE: metrics}
        return _run(server_argv, front_argv, workers, server_env, front_env)


def _run(
    server_argv: Sequence[str],
    front_argv: Sequence[str],
    workers: int,
    server_env: Mapping[str, str],
    front_env: Mapping[str, str],
) -> int:
    stopping: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda number, _frame: stopping.append(number))
    server = subprocess.Popen(list(server_argv), env=dict(server_env))
    fronts = [subprocess.Popen(list(front_argv), env=dict(front_env)) for _ in range(workers)]
    children = [server, *fronts]
    ended = None
    while not stopping and ended is None:
        ended = next((child for child in children if child.poll() is not None), None)
        time.sleep(POLL_S)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        child.wait()
    if stopping or ended is server:
        return server.returncode if server.returncode >= 0 else 128 - server.returncode
    assert ended is not None
    return ended.returncode if ended.returncode > 0 else 1
