"""The OpenAI front's one process tree (launch/supervise.py), with stand-in children: whoever ends first ends the
rest, and the exit code is tritonserver's (or the failed child's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtllm_entrypoint import contract
from trtllm_entrypoint.launch import supervise
from trtllm_entrypoint.openai.plan import FrontPlan

pytestmark = pytest.mark.process

RUN = """
import sys
from trtllm_entrypoint.launch import supervise
supervise.STALL_S, supervise.START_S = {stall_s}, {start_s}
sys.exit(supervise.run({server!r}, {front!r}, {workers}, {{}}, {{}}, grace_s={grace_s}))
"""
# A worker of the front as far as the supervisor sees it: it notes its pid, its loop beats (openai/liveness.py) for
# `beats` seconds, then the loop is stuck (a blocking call, as a runaway template or tokenizer call would be).
STUCK_WORKER = """
import asyncio, os, sys, time
from trtllm_entrypoint.openai import liveness
with open(sys.argv[1], "a") as starts:
    starts.write(f"{{os.getpid()}}\\n")
async def main():
    liveness.start(asyncio.get_running_loop(), liveness.heartbeat_fd(os.environ.get({var!r})))
    await asyncio.sleep({beats})
    time.sleep(600)
asyncio.run(main())
"""


def start(
    tmp_path: Path,
    server: list[str],
    front: list[str],
    workers: int = 2,
    *,
    grace_s: float = 30,
    stall_s: float = 20,
    start_s: float = 300,
) -> subprocess.Popen:
    code = RUN.format(server=server, front=front, workers=workers, grace_s=grace_s, stall_s=stall_s, start_s=start_s)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "entrypoints")}
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=tmp_path)


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_a_server_that_exits_ends_the_front_with_the_servers_code(tmp_path):
    tree = start(tmp_path, ["sh", "-c", "sleep 0.5; exit 3"], ["sleep", "60"])
    assert tree.wait(timeout=20) == 3


def test_a_front_worker_that_fails_ends_the_server_and_the_tree_fails(tmp_path):
    tree = start(tmp_path, ["sleep", "60"], ["sh", "-c", "sleep 0.5; exit 0"], workers=1)
    assert tree.wait(timeout=20) == 1  # a front that ends by itself is a failure, whatever its code


def test_sigterm_reaches_every_child_and_the_exit_code_is_the_servers(tmp_path):
    marker = tmp_path / "front-got-term"
    front = ["sh", "-c", f"trap 'touch {marker}; exit 0' TERM; sleep 60 & wait"]
    tree = start(tmp_path, ["sh", "-c", "trap 'exit 0' TERM; sleep 60 & wait"], front, workers=2)
    deadline = time.monotonic() + 10
    while len(children_of(tree.pid)) < 3:
        assert time.monotonic() < deadline, "the server and two workers never started"
        time.sleep(0.05)
    tree.send_signal(signal.SIGTERM)
    assert tree.wait(timeout=20) == 0 and marker.exists()


PLAN = FrontPlan(
    host="0.0.0.0",
    port=9000,
    workers=2,
    triton_url="http://127.0.0.1:8000",
    served_name="m",
    entry_model="m",
    workflow="llmapi",
    config="/repo/m/config.pbtxt",
    tokenizer="/tok",
    restricted=("inference",),
    max_seq_len=2048,
    shutdown_timeout=30.0,
    max_generations=256,
)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except FileNotFoundError:
        return False


def test_a_worker_whose_loop_is_stuck_is_killed_and_started_again_while_the_rest_serves_on(tmp_path):
    starts = tmp_path / "starts"
    front = [sys.executable, "-c", STUCK_WORKER.format(beats=1, var=contract.FRONT_HEARTBEAT_VARIABLE), str(starts)]
    tree = start(tmp_path, ["sleep", "60"], front, workers=1, stall_s=1.5)
    deadline = time.monotonic() + 20
    while len(starts.read_text().split() if starts.exists() else []) < 2:
        assert time.monotonic() < deadline, "the stuck worker was never replaced"
        assert tree.poll() is None, "the tree ended instead of replacing the worker"
        time.sleep(0.1)
    first = int(starts.read_text().split()[0])
    assert not alive(first), "the stuck worker still runs beside its replacement"
    tree.send_signal(signal.SIGTERM)
    assert tree.wait(timeout=20) == 128 + signal.SIGTERM  # `sleep` as the server dies of the SIGTERM


def test_a_worker_that_never_beats_is_replaced_after_the_start_limit(tmp_path):
    starts = tmp_path / "starts"
    never_beats = "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n'); time.sleep(600)"
    front = [sys.executable, "-c", never_beats, str(starts)]
    tree = start(tmp_path, ["sleep", "60"], front, workers=1, start_s=1.5)
    deadline = time.monotonic() + 20
    while len(starts.read_text().split() if starts.exists() else []) < 2:
        assert time.monotonic() < deadline, "the silent worker was never replaced"
        time.sleep(0.1)
    tree.send_signal(signal.SIGTERM)
    tree.wait(timeout=20)


@pytest.mark.parametrize("how", ["ignores SIGTERM", "is stopped"])
def test_the_tree_never_outlives_the_server_by_more_than_the_grace(tmp_path, how):
    """tritonserver dies while a worker does not end on SIGTERM: the worker gets SIGKILL after the grace."""
    pids = tmp_path / "pids"
    worker = "trap '' TERM; sleep 60 & wait; sleep 60" if how == "ignores SIGTERM" else "kill -STOP $$; sleep 60"
    front = ["sh", "-c", f"echo $$ >> {pids}; {worker}"]
    tree = start(tmp_path, ["sh", "-c", "sleep 1; exit 3"], front, workers=2, grace_s=1)
    began = time.monotonic()
    assert tree.wait(timeout=20) == 3
    assert time.monotonic() - began < 1 + 1 + 5, "the tree waited for the stuck workers past the grace"
    assert not any(alive(int(pid)) for pid in pids.read_text().split())


def test_a_worker_stops_itself_when_the_supervisor_is_gone(tmp_path):
    read_end, write_end = os.pipe()
    code = (
        "import asyncio, os\n"
        "from trtllm_entrypoint.openai import liveness\n"
        "async def main():\n"
        f"    liveness.start(asyncio.get_running_loop(), {write_end})\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "entrypoints"),
        contract.FRONT_HEARTBEAT_VARIABLE: str(write_end),
    }
    worker = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(write_end,))
    os.close(write_end)
    os.set_blocking(read_end, True)
    assert os.read(read_end, 1) == b"."  # it beats
    os.close(read_end)
    assert worker.wait(timeout=20) == -signal.SIGTERM


def test_the_limits_hold_the_documented_bounds():
    from trtllm_entrypoint.openai import liveness  # noqa: PLC0415

    assert supervise.STALL_S + supervise.POLL_S + liveness.BEAT_S <= 30  # a stuck worker is noticed within 30 s
    assert contract.DEFAULT_EXIT_TIMEOUT_SECS + supervise.KILL_MARGIN_S < contract.STOP_GRACE_SECS


def test_the_fronts_environment_holds_no_secret_but_the_key_it_reads_and_drops():
    container = {
        "PATH": "/usr/bin",
        "LC_ALL": "C.UTF-8",
        "HF_TOKEN": "hf_secret",
        "TRITON_ADMIN_KEY": "admin-secret",
        "TRITON_ADMIN_KEY_FILE": "/run/secrets/k",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "HTTPS_PROXY": "http://user:pass@proxy:3128",
        "MODEL_ID": "org/name",
    }
    env = supervise.front_environ(container, "the-key", PLAN)
    assert env["PATH"] == "/usr/bin" and env["LC_ALL"] == "C.UTF-8"
    assert FrontPlan.from_json(env[contract.FRONT_PLAN_VARIABLE]) == PLAN
    assert env[contract.FRONT_KEY_VARIABLE] == "the-key" and env["HF_HUB_OFFLINE"] == "1"
    leaked = [v for v in ("hf_secret", "admin-secret", "aws-secret", "pass", "/run/secrets") if v in str(env)]
    assert not leaked and "MODEL_ID" not in env


def test_the_fronts_environment_carries_its_plan_the_key_and_its_own_libraries_only_when_present(tmp_path, monkeypatch):
    env = supervise.front_environ({"PYTHONPATH": "/given", "LANG": "b"}, "the-key", PLAN)
    assert env[contract.FRONT_KEY_VARIABLE] == "the-key" and env["LANG"] == "b"
    assert FrontPlan.from_json(env[contract.FRONT_PLAN_VARIABLE]) == PLAN
    assert "the-key" not in env[contract.FRONT_PLAN_VARIABLE]
    assert env["PYTHONPATH"].split(os.pathsep)[-1] == "/given"  # the vendored libraries come first, where present
    monkeypatch.setattr(contract, "FRONT_DIR", str(tmp_path))
    (tmp_path / "any").mkdir()
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    assert supervise.front_environ({}, "k", PLAN)["PYTHONPATH"] == os.pathsep.join(
        [str(tmp_path / python), str(tmp_path / "any")]
    )


def test_every_worker_gets_one_private_metrics_directory_removed_at_the_end(tmp_path):
    # each worker writes, into a file of its own, the directory it was given and that directory's mode
    probe = (
        "import os, sys; d = os.environ['PROMETHEUS_MULTIPROC_DIR']; "
        "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').write(f'{d} {oct(os.stat(d).st_mode & 0o777)}')"
    )
    front = ["sh", "-c", f'{sys.executable} -c "{probe}" {tmp_path}; sleep 60']
    tree = start(tmp_path, ["sh", "-c", "sleep 3; exit 0"], front, workers=2)
    assert tree.wait(timeout=30) == 0
    seen = {p.read_text() for p in tmp_path.iterdir() if p.name.isdigit()}
    assert len(seen) == 1, seen  # one directory for all the workers, private to this UID
    directory, mode = seen.pop().split()
    assert mode == "0o700" and not Path(directory).exists()  # gone with the front


def test_each_start_gets_an_empty_metrics_directory():
    with supervise.metrics_dir() as first, supervise.metrics_dir() as second:
        assert first != second and os.listdir(first) == os.listdir(second) == []
        Path(first, "counter_1.db").write_text("x")
    assert not Path(first).exists() and not Path(second).exists()
