"""The OpenAI front (LaunchPlan.front): one foreground process tree of tritonserver and the OpenAI front's workers.

This process stays (it is the container's main process, under tini) and runs the children: tritonserver as Triton
mode runs it, and OPENAI_WORKERS processes of the front, which share OPENAI_PORT through SO_REUSEPORT. SIGTERM or
SIGINT goes to every child: the front's workers finish their streams and exit, tritonserver drains and exits (its
--exit-timeout-secs). Any child that ends by itself ends the others: the container then exits with that child's
code (tritonserver's when it is the one), so a restart policy restarts all of it and readiness never lies.

Two things are bounded, so that the container never hangs half-alive:
- Stopping: children still running `grace_s` after SIGTERM get SIGKILL (a worker whose event loop is stuck never
  handles SIGTERM), so the container never outlives tritonserver by more than that grace.
- A stuck worker: each worker's event loop writes a byte to its own pipe every second (openai/liveness.py). One that
  wrote nothing for `stall_s` (or never began within `start_s`) gets SIGKILL and is started again: its connections
  were hanging already, and the other workers and tritonserver keep serving. A worker that exits by itself is a bug,
  and ends the tree as before.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtllm_entrypoint import contract
from trtllm_entrypoint.openai.plan import FrontPlan
from trtllm_entrypoint.storage import paths

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.2
# A worker beats every second (openai/liveness.py); one silent this long is stuck. Noticed within STALL_S + POLL_S.
STALL_S = 20.0
# From a worker's start to its first beat: imports and tokenizer loading, slow on a loaded machine.
START_S = 300.0
# After SIGTERM: the children's own drain (EXIT_TIMEOUT_SECS) and this margin, then SIGKILL. Below the documented
# stop grace (contract.STOP_GRACE_SECS), so the supervisor, not the runtime, ends a stuck child.
KILL_MARGIN_S = 5.0

# What a worker of the front keeps of the container's environment: nothing that could hold a secret (HF_TOKEN,
# TRITON_ADMIN_KEY, cloud or proxy credentials...), only what Python, the locale and the tokenizers read. It gets the
# admin key in contract.FRONT_KEY_VARIABLE (read and dropped at its start) and its plan in FRONT_PLAN_VARIABLE.
FRONT_KEPT = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "PYTHONDONTWRITEBYTECODE",
        "TOKENIZERS_PARALLELISM",
        "RAYON_NUM_THREADS",
        "OMP_NUM_THREADS",
        "HF_HOME",
        "XDG_CACHE_HOME",
    }
)
FRONT_KEPT_PREFIXES = ("LC_",)
# The workers read only local files: no hub or network access, whatever a tokenizer's files ask for.
FRONT_FIXED = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def front_path_environ(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a process of the front (a worker, or the start's template check): what it needs of the
    container's (FRONT_KEPT: no secret), and the front's vendored libraries first on the path (the pure ones and the
    compiled set of this Python, the one that runs the front)."""
    compiled = os.path.join(contract.FRONT_DIR, f"py{sys.version_info.major}.{sys.version_info.minor}")
    pure = os.path.join(contract.FRONT_DIR, "any")
    own = [compiled, pure] if os.path.isdir(pure) else []
    path = [*own, base.get("PYTHONPATH", "")]
    kept = {k: v for k, v in base.items() if k in FRONT_KEPT or k.startswith(FRONT_KEPT_PREFIXES)}
    extra = {"PYTHONPATH": os.pathsep.join(p for p in path if p)} if any(path) else {}
    return {**kept, **extra, **FRONT_FIXED}


def front_environ(base: Mapping[str, str], key: str, plan: FrontPlan) -> dict[str, str]:
    """A worker's environment: front_path_environ's, its plan and the admin key (both read and dropped from its
    environment at start; the key never on a command line)."""
    own_values = {contract.FRONT_PLAN_VARIABLE: plan.to_json(), contract.FRONT_KEY_VARIABLE: key}
    return {**front_path_environ(base), **own_values}


@dataclass
class Worker:
    """One front process, and the read end of the pipe it beats on."""

    process: subprocess.Popen[bytes]
    beats: int  # the pipe's read end (non-blocking)
    started: float
    last_beat: float | None = None

    def silent_for(self, now: float) -> tuple[float, float]:
        """(seconds without a sign of life, the limit that applies)."""
        if self.last_beat is None:
            return now - self.started, START_S
        return now - self.last_beat, STALL_S


def start_worker(argv: Sequence[str], env: Mapping[str, str]) -> Worker:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        process = subprocess.Popen(
            list(argv), env={**env, contract.FRONT_HEARTBEAT_VARIABLE: str(write_end)}, pass_fds=(write_end,)
        )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return Worker(process, read_end, time.monotonic())


def _read_beats(workers: list[Worker], timeout: float) -> None:
    ready, _, _ = select.select([w.beats for w in workers], [], [], timeout)
    now = time.monotonic()
    for worker in workers:
        if worker.beats in ready:
            try:
                if os.read(worker.beats, 4096):
                    worker.last_beat = now
            except BlockingIOError:
                pass


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


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
    *,
    grace_s: float = contract.DEFAULT_EXIT_TIMEOUT_SECS + KILL_MARGIN_S,
    warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> int:
    """Start them all, wait until one ends or a stop signal comes, stop the rest; the exit code."""
    with metrics_dir() as metrics:
        front_env = {**front_env, contract.FRONT_METRICS_VARIABLE: metrics}
        return _run(server_argv, front_argv, workers, server_env, front_env, grace_s, warn)


def _run(
    server_argv: Sequence[str],
    front_argv: Sequence[str],
    workers: int,
    server_env: Mapping[str, str],
    front_env: Mapping[str, str],
    grace_s: float,
    warn: Callable[[str], None],
) -> int:
    stopping: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda number, _frame: stopping.append(number))
    server = subprocess.Popen(list(server_argv), env=dict(server_env))
    fronts = [start_worker(front_argv, front_env) for _ in range(workers)]
    ended = None
    try:
        while not stopping and ended is None:
            _read_beats(fronts, POLL_S)
            ended = next((c for c in [server, *(w.process for w in fronts)] if c.poll() is not None), None)
            now = time.monotonic()
            for i, worker in enumerate(fronts):
                silent, limit = worker.silent_for(now)
                if ended is None and not stopping and silent > limit:
                    warn(
                        f"the OpenAI front's worker {worker.process.pid} gave no sign of life for {silent:.0f} s: "
                        "killed and started again"
                    )
                    _kill(worker.process)
                    os.close(worker.beats)
                    fronts[i] = start_worker(front_argv, front_env)
        children = [("tritonserver", server), *(("an OpenAI front worker", w.process) for w in fronts)]
        for _, child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name, child in children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                warn(f"{name} (process {child.pid}) still ran {grace_s:.0f} s after SIGTERM: killed")
                _kill(child)
    finally:
        for worker in fronts:
            os.close(worker.beats)
    if stopping or ended is server:
        return server.returncode if server.returncode >= 0 else 128 - server.returncode
    assert ended is not None
    return ended.returncode if ended.returncode > 0 else 1
