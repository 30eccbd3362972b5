"""The ready line: its fields from the plan (through `prepare`), and the watcher that logs it once the server
answers readiness, without taking the server's PID or signals."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import threading
import time

import pytest

from harness.image import Image, records, templates_for
from tests.unit.entrypoint_runs import free_port

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process

ADMIN_KEY = "ready-admin-key-0123456789"


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


def ready_fields(image, **env) -> dict:
    result = image.run("prepare", **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["ready"]


def test_the_ready_line_is_built_from_the_plan_for_triton_generate(image):
    ready = ready_fields(image, HTTP_PORT="18000", GRPC_PORT="18001", METRICS_PORT="18002")
    assert ready["model"] == str(image.model) and ready["source"] == "checkpoint"
    assert (ready["tag"], ready["tensorrt_llm"], ready["workflow"]) == ("25.01", "0.17.0", "engine")
    assert ready["http"] == "http://localhost:18000" and ready["grpc"] == "localhost:18001"
    assert ready["ports"].startswith("inside the container"), "the ports named are the container's, not the host's"
    assert list(ready)[list(ready).index("ports") + 1] == "http", "said before the ports it is about"
    assert ready["metrics"] == "http://localhost:18002/metrics" and "openai" not in ready
    assert ready["served_model_name"] == "ensemble"
    assert ready["admin_key"].startswith("random")
    argv = shlex.split(ready["try"])
    assert argv[:3] == ["curl", "-s", "http://localhost:18000/v2/models/ensemble/generate"]
    assert json.loads(argv[-1])["text_input"] and json.loads(argv[-1])["max_tokens"] > 0
    assert list(ready)[-1] == "try", "last, so that in a text log the rest of the line is the command"


def test_the_ready_line_for_openai_names_the_chat_route_and_a_given_key_without_showing_it(image):
    ready = ready_fields(
        image, FRONTEND="openai", OPENAI_PORT="19000", SERVED_MODEL_NAME="llm", TRITON_ADMIN_KEY=ADMIN_KEY
    )
    assert ready["openai"] == "http://localhost:19000/v1" and ready["served_model_name"] == "llm"
    assert ready["admin_key"] == "given" and ADMIN_KEY not in json.dumps(ready)
    argv = shlex.split(ready["try"])
    assert argv[2] == "http://localhost:19000/v1/chat/completions" and "Content-Type: application/json" in argv
    body = json.loads(argv[-1])
    assert body["model"] == "llm" and body["messages"][0]["role"] == "user"


def test_the_ready_line_is_logged_once_after_the_server_answers_readiness(image):
    # KServe's stock command line (tritonserver from PATH, here the double): one rank runs /opt/tritonserver, which
    # only the images have.
    port, engine = free_port(), image.prebuilt()
    proc = image.start(
        "tritonserver",
        f"--model-store={engine}",
        f"--http-port={port}",
        f"--grpc-port={free_port()}",
        f"--metrics-port={free_port()}",
        MODEL_ID="",
        TRITONSERVER_DOUBLE_READY_DELAY="2",
    )
    lines: queue.Queue[tuple[float, str]] = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            lines.put((time.monotonic(), line))

    threading.Thread(target=read, daemon=True).start()
    seen: list[tuple[float, str]] = []
    try:
        deadline = time.monotonic() + 60
        while not any(" info: ready " in line for _, line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(line for _, line in seen)
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=0.5))
        (server,) = records(image.records, "tritonserver")
        assert server["pid"] == proc.pid, "the server is the process that was started: it was exec'd"
        time.sleep(1.5)  # a second line would come within the watcher's next poll
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    while not lines.empty():
        seen.append(lines.get())
    started = next(t for t, line in seen if "starting the server" in line)
    ready = [(t, line) for t, line in seen if " info: ready " in line]
    assert len(ready) == 1 and ready[0][0] - started >= 1.5, "logged once, after the server's readiness delay"
    line = ready[0][1]
    assert f"http=http://localhost:{port} " in line and "served_model_name=ensemble" in line
    assert line.rstrip("\n").split(" try=", 1)[1].startswith(f"curl -s http://localhost:{port}/v2/models/ensemble/")
    assert proc.returncode == 0


def test_with_frontend_openai_the_model_is_served_under_its_own_name(image):
    """vLLM's and NIM's clients send the model's name: a local model's directory name here (a hub id as given), and
    the ready line, the front's plan and the request to try agree; Triton's models keep their own names (the engine
    workflow's front asks the tensorrt_llm model with token ids)."""
    result = image.run("prepare", FRONTEND="openai")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["ready"]["served_model_name"] == image.model.name == "tiny"
    assert json.loads(shlex.split(out["ready"]["try"])[-1])["model"] == "tiny"
    plan = out["front"]["plan"]
    assert (plan["served_name"], plan["entry_model"]) == ("tiny", "tensorrt_llm")
    assert plan["config"].endswith("/tensorrt_llm/config.pbtxt")


def test_an_openai_name_may_be_a_hub_id_and_triton_keeps_its_own(image):
    out = ready_fields(image, FRONTEND="openai", SERVED_MODEL_NAME="meta-llama/Llama-3.1-8B-Instruct")
    assert out["served_model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert (image.repo / "ensemble" / "config.pbtxt").is_file()
    refused = image.run("prepare", SERVED_MODEL_NAME="meta-llama/Llama-3.1-8B-Instruct")  # a Triton model name
    assert refused.returncode == 2 and "SERVED_MODEL_NAME" in refused.stderr
