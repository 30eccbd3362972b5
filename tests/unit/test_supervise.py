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
sys.exit(supervise.run({server!r}, {front!r}, {workers}, {{}}, {{}}))
"""


def start(tmp_path: Path, server: list[str], front: list[str], workers: int = 2) -> subprocess.Popen:
    code = RUN.format(server=server, front=front, workers=workers)
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
)


def test_the_fronts_environment_carries_its_plan_the_key_and_its_own_libraries_only_when_present(tmp_path, monkeypatch):
    env = supervise.front_environ({"PYTHONPATH": "/given", "A": "b"}, "the-key", PLAN)
    assert env[contract.FRONT_KEY_VARIABLE] == "the-key" and env["A"] == "b"
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
