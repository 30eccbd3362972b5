"""The OpenAI front under abuse (issue 36), started as a user starts it: the plan `trtllm-entrypoint prepare` prints
with FRONTEND=openai, run by the entrypoint's supervisor with the real tritonserver 2.51.0 and upstream's models
(harness/realfront.py), asked over HTTP as clients would. Doubles: the engine."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import realfront
from harness.image import Image, templates_for
from harness.other_uid import NOBODY, bind_as
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


def complete(front: realfront.RunningFront, name: str, timeout: float = 30) -> int:
    body = json.dumps({"model": name, "prompt": PROMPT, "max_tokens": 2}).encode()
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
        statuses = [
            complete(front, out["ready"]["served_model_name"]) for _ in range(8)
        ]  # the kernel spreads connections over both workers
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
        served = complete(front, out["ready"]["served_model_name"])
    assert environs and served == 200
    for env in environs:
        assert not {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "TRITON_ADMIN_KEY"} & set(env), sorted(env)
        others = {k: v for k, v in env.items() if k != "TRTLLM_FRONT_ADMIN_KEY"}  # the one it reads and drops
        assert not any(s in v for v in others.values() for s in (*secrets.values(), KEY))


@pytest.mark.skipif(os.geteuid() != 0, reason="taking another UID needs root")
def test_no_other_uid_can_listen_on_the_openai_port_while_the_front_serves(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img)
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        port = front.http_port
        tries = {
            host: bind_as(NOBODY, family, host, port, reuse=True)
            for family, host in [(socket.AF_INET6, "::1"), (socket.AF_INET6, "::"), (socket.AF_INET, "127.0.0.1")]
            if family == socket.AF_INET or socket.has_ipv6
        }
        over_ipv6 = urllib.request.urlopen(f"http://[::1]:{port}/health/ready", timeout=10).status  # noqa: S310
    assert all(code != 0 for code in tries.values()), tries
    assert over_ipv6 == 200


def received_from(port: int) -> int:
    """Bytes this host's connections to 127.0.0.1:`port` have received so far (ss's bytes_received: the worker's
    streams from tritonserver)."""
    done = subprocess.run(
        ["ss", "-tinH", "state", "established", "dst", f"127.0.0.1:{port}"], capture_output=True, text=True, check=True
    )
    return sum(int(n) for n in re.findall(r"bytes_received:(\d+)", done.stdout))


def raw_post(port: int, path: str, body: bytes, leave_after_s: float | None = None) -> tuple[int, dict] | None:
    """POST over a plain socket and read the answer; with `leave_after_s`, close the connection after that long
    without reading (a client that gives up on a whole answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)
        if leave_after_s is not None:
            time.sleep(leave_after_s)
            return None
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss to see what the worker receives")
def test_a_user_started_front_is_honest_bounded_and_stops_what_nobody_reads(tmp_path, real_triton):
    """One `serve` with FRONTEND=openai (one worker, a slow engine): /v1/* says the model is loading until it is
    ready; then a whole answer its client gave up on stops within seconds (its backend stream closed), and hostile
    requests are 4xx naming the field, before any generation."""
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img, OPENAI_WORKERS="1", MAX_SEQ_LEN="32768", MAX_INPUT_LEN="1024")
    env = {**os.environ, "TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S": "0.002", "TRTLLM_ENGINE_DOUBLE_LOAD_DELAY_S": "5"}
    with realfront.start(real_triton, out, KEY, env=env, log_dir=tmp_path, wait=False) as front:
        port = front.http_port
        first = None
        deadline = time.monotonic() + 120
        while first is None:  # the worker's first HTTP answer, before tritonserver has loaded the model
            assert time.monotonic() < deadline
            try:
                urllib.request.urlopen(f"{front.url}/v1/models", timeout=5)  # noqa: S310
                first = (200, {})
            except urllib.error.HTTPError as error:
                first = (error.code, json.loads(error.read()))
            except OSError:
                time.sleep(0.1)
        front.wait_ready(180)
        triton = front.triton_http_port
        body = {"model": out["ready"]["served_model_name"], "prompt": PROMPT, "max_tokens": 20000}
        # A client waits 5 s for a whole answer of 40 s, then gives up. While it waits, the worker reads the
        # generation (the measure is not blind); 3 s after it left, the worker reads nothing more of it.
        client = threading.Thread(target=raw_post, args=(port, "/v1/completions", json.dumps(body).encode(), 5))
        client.start()
        time.sleep(2)
        before = received_from(triton)
        time.sleep(2)
        live_reading = received_from(triton) - before
        client.join()
        time.sleep(3)
        before = received_from(triton)
        time.sleep(2)
        still_reading = received_from(triton) - before
        answers = {
            "fanout": raw_post(port, "/v1/completions", json.dumps({**body, "prompt": ["x"] * 1024, "n": 16}).encode()),
            "max_tokens": raw_post(port, "/v1/completions", json.dumps({**body, "max_tokens": 2**32 + 3}).encode()),
            "not utf-8": raw_post(port, "/v1/completions", b'{"model": "m", "prompt": "\xff"}'),
            "seed -1": raw_post(port, "/v1/completions", json.dumps({**body, "max_tokens": 2, "seed": -1}).encode()),
        }
        log = front.log()
    assert first[0] == 503 and first[1]["error"]["code"] == "model_not_ready", first
    assert live_reading > 256 << 10, f"a live generation read only {live_reading} bytes in 2 s: the measure is blind"
    assert still_reading < 64 << 10, f"the worker still read {still_reading} bytes/2 s for a client that left"
    assert answers["fanout"][0] == 400 and answers["fanout"][1]["error"]["param"] == "prompt"
    assert answers["max_tokens"][0] == 400 and answers["max_tokens"][1]["error"]["param"] == "max_tokens"
    assert answers["not utf-8"][0] == 400
    assert answers["seed -1"][0] == 200  # a 502 from the backend before: mapped into its UINT64
    assert "Traceback" not in log
