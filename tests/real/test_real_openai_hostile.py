"""The OpenAI front under abuse (issue 36), started as a user starts it: the plan `trtllm-entrypoint prepare` prints
with FRONTEND=openai, run by the entrypoint's supervisor with the real tritonserver 2.51.0 and upstream's models
(harness/realfront.py), asked over HTTP as clients would. Doubles: the engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import realfront
from harness.image import Image, templates_for
from harness.tiny_checkpoint import PROMPT
from tests.real.test_real_openai import KEY, prepared

pytest.importorskip("aiohttp")

FRONT_MODULE = "trtllm_entrypoint.openai"


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def workers(front: realfront.RunningFront) -> list[int]:
    return [p for p in children(front.process.pid) if FRONT_MODULE in cmdline(p)]


def server_pid(front: realfront.RunningFront) -> int:
    return next(p for p in children(front.process.pid) if "tritonserver" in cmdline(p))


def complete(front: realfront.RunningFront, timeout: float = 30) -> int:
    body = json.dumps({"model": "ensemble", "prompt": PROMPT, "max_tokens": 2}).encode()
    request = urllib.request.Request(
        f"{front.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
        return answer.status


def environ_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def test_a_stuck_worker_is_replaced_within_30_s_and_the_front_serves_on(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img, OPENAI_WORKERS="2")
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        deadline = time.monotonic() + 120
        while len(workers(front)) < 2:  # both have started (the supervisor's own check is no test of this)
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stuck = workers(front)[0]
        os.kill(stuck, signal.SIGSTOP)  # its event loop answers nothing from now on
        stopped_at = time.monotonic()
        while stuck in workers(front):
            assert time.monotonic() - stopped_at < 30, "the stuck worker is still there after 30 s"
            time.sleep(0.2)
        noticed = time.monotonic() - stopped_at
        deadline = time.monotonic() + 120
        while len(workers(front)) < 2 or not front.ready():
            assert time.monotonic() < deadline, "no worker replaced the stuck one"
            time.sleep(0.2)
        time.sleep(5)  # the new worker has loaded and binds the port
        statuses = [complete(front) for _ in range(8)]  # the kernel spreads connections over both workers
        log = front.log()
    assert noticed < 30 and statuses == [200] * 8
    assert f"worker {stuck} gave no sign of life" in log


def test_the_tree_ends_within_the_grace_when_tritonserver_dies_beside_a_stuck_worker(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img, OPENAI_WORKERS="2", EXIT_TIMEOUT_SECS="3")
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        for pid in workers(front):
            os.kill(pid, signal.SIGSTOP)  # SIGTERM alone never ends them
        stuck = workers(front)
        os.kill(server_pid(front), signal.SIGKILL)
        died = time.monotonic()
        front.process.wait(timeout=60)
        took = time.monotonic() - died
    assert took < 3 + 5 + 3, f"the supervisor outlived tritonserver by {took:.0f} s"
    assert not any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text() for pid in stuck)


def test_the_workers_environment_holds_no_secret(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    secrets = {"HF_TOKEN": "hf_" + "x" * 30, "AWS_SECRET_ACCESS_KEY": "aws-secret-value-123"}
    out = prepared(img, TRITON_ADMIN_KEY=KEY)
    env = {**os.environ, **secrets, "TRITON_ADMIN_KEY": KEY}
    with realfront.start(real_triton, out, KEY, env=env, log_dir=tmp_path) as front:
        environs = [environ_of(pid) for pid in workers(front)]
        served = complete(front)
    assert environs and served == 200
    for env in environs:
        assert not {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "TRITON_ADMIN_KEY"} & set(env), sorted(env)
        others = {k: v for k, v in env.items() if k != "TRTLLM_FRONT_ADMIN_KEY"}  # the one it reads and drops
        assert not any(s in v for v in others.values() for s in (*secrets.values(), KEY))


def bind_as_nobody(family: socket.AddressFamily, host: str, port: int) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(family) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, port))
                sock.listen()
        except OSError as exc:
            code = exc.errno or 255
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="taking another UID needs root")
def test_no_other_uid_can_listen_on_the_openai_port_while_the_front_serves(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img)
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        port = front.http_port
        tries = {
            host: bind_as_nobody(family, host, port)
            for family, host in [(socket.AF_INET6, "::1"), (socket.AF_INET6, "::"), (socket.AF_INET, "127.0.0.1")]
            if family == socket.AF_INET or socket.has_ipv6
        }
        over_ipv6 = urllib.request.urlopen(f"http://[::1]:{port}/health/ready", timeout=10).status  # noqa: S310
    assert all(code != 0 for code in tries.values()), tries
    assert over_ipv6 == 200
