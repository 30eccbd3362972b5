"""End to end against a real Docker engine: `python build.py` builds our images FROM stand-in NGC images, and
`docker run` serves a tiny checkpoint through the entrypoint.

The server in the containers is the REAL tritonserver 2.51.0 (NGC 24.10's core, from PyPI's nvidia-pytriton wheel;
it stays 2.51.0 whatever tag the stand-in claims), several ranks start under real Open MPI, and the assertions are
about real responses. The preprocessing, postprocessing and BLS models are upstream's own model.py files, which
the stand-in carries in /app/all_models as NGC does (its labels say which set). Doubles remain for what needs a GPU:
the engine (a Python-based `tensorrtllm` backend), trtllm-build, the checkpoint converter and nvidia-smi; the
doubles that build the engine record how they were called.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.build_standin import MODELS_LABEL, PYTHON_MODELS_LABEL, upstream_templates
from harness.doubles import read_records
from harness.realtriton import TRITON_VERSION
from harness.tiny_checkpoint import PROMPT, PROMPT_WORDS
from tests.docker.conftest import (
    E2E_TOKEN,
    FAST_HEALTHCHECK,
    REPO,
    address,
    http,
    in_background,
    logs,
    matrix_for_standin,
    processes,
    ready_now,
    record_mount,
    run_build,
    stream,
    tokens,
    wait_health_status,
    wait_ready,
)
from tests.doubles.double_records import parse_flags
from trtllm_entrypoint import contract

NEW_TAG = "25.01"  # the image ships /app (templates, examples)
OLD_TAG = "24.08"  # no /app: build.py bakes the backend assets from --backend-dir
CACHE = "/var/cache/trtllm"
STOCK_KSERVE_ARGS = [
    "tritonserver",
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]
TWO_GPUS = "NVIDIA H100 80GB HBM3|9.0|81559;NVIDIA H100 80GB HBM3|9.0|81559"
ADMIN_KEY = "e2e-admin-key-0123456789"


def flags_of(entry: dict) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_flags(entry["argv"]).items()}


def serve(containers, image, model, records, *, cache=None, env=None, mount="/models/tiny", **kwargs):
    """The image serving `model`, mounted read-only at `mount` with MODEL_ID pointing there."""
    volumes = {str(model): {"bind": mount, "mode": "ro"}, **record_mount(records)}
    if cache:
        volumes[cache] = {"bind": CACHE, "mode": "rw"}
    environment = {"MODEL_ID": mount, "DOUBLE_RECORD_DIR": "/records", **(env or {})}
    return containers(image, environment=environment, volumes=volumes, healthcheck=FAST_HEALTHCHECK, **kwargs)


def generate(container, max_tokens: int = 8, *, model: str = "ensemble", port: int = 8000) -> list[str]:
    """The generated text's tokens for the README's prompt, asserted to come from that prompt."""
    answer = http(
        container, f"/v2/models/{model}/generate", {"text_input": PROMPT, "max_tokens": max_tokens}, port=port
    )
    words = tokens(answer["text_output"])
    assert len(words) == max_tokens and set(words) <= set(PROMPT_WORDS), answer
    return words


@pytest.fixture(scope="module")
def server(built, docker_client):
    image = built(NEW_TAG).image("server")
    labels = docker_client.images.get(image).labels
    print(f"{image}: /app/all_models from {labels[MODELS_LABEL]}, Python models: {labels[PYTHON_MODELS_LABEL]}")
    return image


def test_the_image_runs_upstreams_own_python_models(server, docker_client):
    """NGC images ship upstream's preprocessing/postprocessing/BLS model.py files from 25.01: so does the stand-in,
    and our image serves them (never a double) wherever the stored upstream set has them."""
    assert docker_client.images.get(server).labels[PYTHON_MODELS_LABEL] == "upstream's"


def test_serve_builds_the_engine_once_and_reuses_it(server, tiny_model, records, cache_volume, containers):
    settings = {"MAX_BATCH_SIZE": "8", "MAX_INPUT_LEN": "512", "MAX_SEQ_LEN": "1024", "TRITON_ADMIN_KEY": ADMIN_KEY}
    first = serve(containers, server, tiny_model, records, cache=cache_volume, env=settings)
    wait_ready(first)
    assert wait_health_status(first) == "healthy", logs(first)

    [convert] = read_records(records, "convert_checkpoint")
    [build] = read_records(records, "trtllm-build")
    assert flags_of(convert)["model_dir"] == "/models/tiny"
    build_flags = flags_of(build)
    assert build_flags["checkpoint_dir"] == flags_of(convert)["output_dir"]
    assert build_flags["output_dir"].startswith(f"{CACHE}/engines/")
    assert {k: build_flags.get(k) for k in ("max_batch_size", "max_input_len", "max_seq_len", "kv_cache_type")} == {
        "max_batch_size": "8",
        "max_input_len": "512",
        "max_seq_len": "1024",
        "kv_cache_type": "paged",
    }
    # The real server, as the container's main process, answering with text made from the prompt.
    # tini is PID 1; the server is its child, exec'd by the entrypoint in its place.
    assert server_process(first)[2] == 1
    assert http(first, "/v2")["version"] == TRITON_VERSION
    models = {m["name"]: m["state"] for m in http(first, "/v2/repository/index", {}, headers={"admin-key": ADMIN_KEY})}
    assert {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"} <= set(models)
    assert set(models.values()) == {"READY"}, models
    print(f"Triton {TRITON_VERSION}: {PROMPT!r} -> {' '.join(generate(first))!r}")

    second = serve(containers, server, tiny_model, records, cache=cache_volume, env=settings)
    wait_ready(second)
    assert len(read_records(records, "trtllm-build")) == 1, "the second replica rebuilt a cached engine"
    generate(second)


def test_three_replicas_on_one_cache_build_once_and_a_replaced_one_reuses_everything(
    server, tiny_model, records, cache_volume, containers
):
    """Autoscaled replicas share one cache volume: they start together, one builds, all serve; a replica killed
    and replaced (what a crashed pod becomes) converts, builds and writes nothing."""
    replicas = [serve(containers, server, tiny_model, records, cache=cache_volume) for _ in range(3)]
    for replica in replicas:
        wait_ready(replica, timeout_s=300)
    assert len(read_records(records, "convert_checkpoint")) == 1, "the replicas converted the checkpoint twice"
    assert len(read_records(records, "trtllm-build")) == 1, "the replicas built the engine twice"
    answers = {tuple(generate(replica)) for replica in replicas}
    assert len(answers) == 1, answers  # one engine, one answer

    replicas[1].kill()
    replacement = serve(containers, server, tiny_model, records, cache=cache_volume)
    wait_ready(replacement)
    assert len(read_records(records, "convert_checkpoint")) == 1 and len(read_records(records, "trtllm-build")) == 1
    log = logs(replacement)
    assert "engine cache hit" in log and "model repository up to date" in log, log
    assert {tuple(generate(replacement))} == answers
    generate(replicas[0]), generate(replicas[2])  # the survivors kept serving


def status(container, route: str, body: dict | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(f"http://{address(container)}:8000{route}", data=data, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_default_run_closes_the_admin_apis_and_still_generates(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, env={"LOG_LEVEL": "debug"})  # logs the command line
    wait_ready(container)
    closed = {
        route: status(container, route)
        for route in ("/v2/systemsharedmemory/status", "/v2/logging", "/v2/models/stats", "/v2/trace/setting")
    }
    closed["/v2/repository/index"] = status(container, "/v2/repository/index", {})
    assert set(closed.values()) == {403}, closed
    assert status(container, "/v2/health/ready") == 200
    generate(container)
    assert "--http-restricted-api=shared-memory,model-repository,statistics,trace,logging:admin-key=***" in logs(
        container
    )


def test_arguments_starting_with_a_dash_go_to_the_server(server, tiny_model, records, containers):
    """`docker run IMAGE --log-verbose=1`, as with postgres: serve, with the arguments appended to the server's."""
    env = {"TRITON_ADMIN_KEY": ADMIN_KEY}
    container = serve(containers, server, tiny_model, records, env=env, command=["--log-verbose=1"])
    wait_ready(container)
    triton = server_process(container)
    assert triton[3].startswith("/opt/tritonserver/bin/tritonserver ") and "--log-verbose=1" in triton[3].split()
    assert http(container, "/v2/logging", headers={"admin-key": ADMIN_KEY})["log_verbose_level"] == 1
    generate(container)


def test_decoupled_mode_streams_through_generate_stream(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, env={"DECOUPLED": "true"})
    wait_ready(container)
    events = stream(
        container, "/v2/models/ensemble/generate_stream", {"text_input": PROMPT, "max_tokens": 5, "stream": True}
    )
    pieces = [event.get("text_output", event) for event in events]
    assert len(pieces) == 5 and set(pieces) <= set(PROMPT_WORDS), events


def test_a_plain_docker_stop_lets_an_in_flight_request_finish_and_exits_zero(server, tiny_model, records, containers):
    # As the README runs it (`--stop-timeout`, no EXIT_TIMEOUT_SECS), then `docker stop` as a user types it.
    assert f"--stop-timeout {contract.STOP_GRACE_SECS} " in (REPO / "README.md").read_text()
    max_tokens, delay = 12, 0.5  # the request needs max_tokens * delay = 6 s
    env = {"TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S": str(delay)}
    container = serve(containers, server, tiny_model, records, env=env, stop_timeout=contract.STOP_GRACE_SECS)
    assert container.attrs["Config"]["StopTimeout"] == contract.STOP_GRACE_SECS
    wait_ready(container)
    request, outcome = in_background(generate, container, max_tokens)
    time.sleep(1.5)
    assert request.is_alive(), "the request must still be in flight when the container is stopped"
    started = time.monotonic()
    subprocess.run(["docker", "stop", container.id], check=True, capture_output=True, timeout=60)
    stopped_after = time.monotonic() - started
    request.join(timeout=30)
    assert "error" not in outcome, f"{outcome.get('error')!r}\n{logs(container)[-3000:]}"
    assert len(outcome["result"]) == max_tokens
    assert container.wait(timeout=30)["StatusCode"] == 0, logs(container)
    assert stopped_after < contract.DEFAULT_EXIT_TIMEOUT_SECS, "the server drains, unloads and exits on its own"


def test_healthcheck_turns_healthy_only_once_the_server_is_ready(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, env={"TRTLLM_ENGINE_DOUBLE_LOAD_DELAY_S": "8"})
    samples = []  # (health status, /v2/health/ready answered 200)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (samples and samples[-1] == ("healthy", True)):
        container.reload()
        assert container.status == "running", logs(container)
        status = container.attrs["State"].get("Health", {}).get("Status", "none")
        samples.append((status, ready_now(container)))
        time.sleep(0.5)
    assert samples[-1] == ("healthy", True), samples
    first_ready = next(i for i, (_, ready) in enumerate(samples) if ready)
    assert first_ready > 0 and all(status != "healthy" for status, _ in samples[:first_ready]), samples
    # Probes are not news: a few more HEALTHCHECK runs (one a second) and readiness calls leave no line in the log.
    before = logs(container)
    for _ in range(3):
        assert ready_now(container)
        time.sleep(1.5)
    probes = [line for line in logs(container).splitlines() if "health" in line.lower()]
    assert len(container.attrs["State"]["Health"]["Log"]) >= 1 and not probes, probes
    assert logs(container).count("\n") - before.count("\n") <= 2, logs(container)[len(before) :]


def test_two_ranks_start_under_mpirun_and_rank_1_loads_only_the_engine(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, env={"TP_SIZE": "2", "NVIDIA_SMI_DOUBLE_GPUS": TWO_GPUS})
    wait_ready(container, timeout_s=180)
    generate(container)
    running = processes(container)
    servers = [p for p in running if p.startswith("/opt/tritonserver/bin/tritonserver ")]
    assert any(p.startswith("mpirun ") for p in running), running
    assert len(servers) == 2, running
    [worker] = [p for p in servers if "--load-model=tensorrt_llm" in p]
    assert "--allow-http=false" in worker and "--http-port" not in worker
    # One Python backend stub per model instance; rank 1's (shared-memory prefix prefix1_) run the engine only.
    rank1_models = {
        re.search(r"/([^/]+)/1/model\.py", p).group(1)
        for p in running
        if "triton_python_backend_stub" in p and " prefix1_" in p
    }
    assert rank1_models == {"tensorrt_llm"}, running


def test_arbitrary_uid_can_build_and_serve(server, tiny_model, records, cache_volume, containers):
    container = serve(containers, server, tiny_model, records, cache=cache_volume, user="12345:0")
    wait_ready(container)
    [build] = read_records(records, "trtllm-build")
    assert (build["uid"], build["gid"]) == (12345, 0)
    generate(container)


def test_read_only_root_file_system_with_tmpfs(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, read_only=True, tmpfs={"/tmp": "rw,exec"})
    wait_ready(container)
    [build] = read_records(records, "trtllm-build")
    assert flags_of(build)["output_dir"].startswith("/tmp/"), "the cache must fall back to the writable /tmp"
    assert "/tmp/trtllm-cache" in logs(container), "the fallback must be announced"
    generate(container)


def readme_grpc_example() -> str:
    """The README's tritonclient example, exactly as written there."""
    [code] = [
        block
        for block in re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
        if "tritonclient.grpc" in block
    ]
    return code


def test_kserve_stock_args_serve_a_read_only_prebuilt_engine(server, prebuilt_engine, records, containers):
    before = sorted((p.name, p.stat().st_mtime_ns) for p in prebuilt_engine.iterdir())
    container = containers(
        server,
        command=STOCK_KSERVE_ARGS,
        healthcheck=FAST_HEALTHCHECK,
        environment={"DOUBLE_RECORD_DIR": "/records", "SERVED_MODEL_NAME": "llm"},
        volumes={str(prebuilt_engine): {"bind": "/mnt/models", "mode": "ro"}, **record_mount(records)},
    )
    wait_ready(container, port=8080)
    assert wait_health_status(container) == "healthy", logs(container)
    line = wait_for_line(container, "info: ready ")  # the stock command line's ports, the name clients use
    assert "http=http://localhost:8080 grpc=localhost:9000" in line and "served_model_name=llm" in line
    assert "/v2/models/llm/generate" in line.split(" try=", 1)[1]
    assert read_records(records, "trtllm-build") == [], "a prebuilt engine must be served as it is"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in prebuilt_engine.iterdir()) == before

    # The README's KServe calls: HTTP on 8080 and its tritonclient example, both by SERVED_MODEL_NAME. The example
    # names our runtime's gRPC port (8001, Triton's own); KServe's stock command line above puts gRPC on 9000.
    generate(container, 64, model="llm", port=8080)
    assert not ready_now(container, 8080, route="/v2/models/ensemble/ready"), "the entry model must be renamed"
    assert '"localhost:8001"' in readme_grpc_example()
    code = readme_grpc_example().replace('"localhost:8001"', f'"{address(container)}:9000"')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr + logs(container)[-3000:]
    words = tokens(done.stdout)
    assert len(words) == 64 and set(words) <= set(PROMPT_WORDS), done.stdout
    # PID 1 is tini, with the stock arguments as given; the server it runs got the filled repository instead.
    triton = server_process(container)
    assert "--model-store=/mnt/models" not in triton[3], "the filled repository must live outside /mnt/models"
    assert triton[2] == 1, "tini's own child"


def test_bad_environment_value_exits_2_before_any_work(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, env={"TP_SIZE": "zero"})
    assert container.wait(timeout=60)["StatusCode"] == 2
    output = logs(container)
    assert "TP_SIZE" in output and "zero" in output
    assert read_records(records, "trtllm-build") == [] and "Started HTTPService" not in output


class FailingHub:
    """A hub that answers every request with 503, on the host's loopback (the container shares the host's network)."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                self.send_error(503)

            do_HEAD = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("hub", ["unreachable", "failing"])
def test_a_hub_that_cannot_answer_is_one_line_and_exit_1_within_seconds(server, records, containers, hub):
    env = {"MODEL_ID": "org/name", "DOUBLE_RECORD_DIR": "/records"}
    failing = FailingHub() if hub == "failing" else None
    try:
        if failing is None:
            kwargs = {"network_mode": "none"}  # no network at all: the hub's name does not resolve
        else:  # the host's network, so the hub is reached on loopback and no other address is ever a target
            env["HF_ENDPOINT"] = f"http://127.0.0.1:{failing.server.server_address[1]}"
            kwargs = {"network_mode": "host"}
        started = time.monotonic()
        container = containers(server, environment=env, volumes=record_mount(records), **kwargs)
        status = container.wait(timeout=120)["StatusCode"]
        elapsed = time.monotonic() - started
    finally:
        if failing is not None:
            failing.close()
    output = logs(container)
    assert status == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error: ") or " error: " in line]
    assert len(errors) == 1 and "Hugging Face hub" in errors[0], output
    assert "Retrying" not in output and "thrown while requesting" not in output and "Traceback" not in output
    assert elapsed < 15, f"took {elapsed:.1f} s: {output}"


def test_token_never_reaches_images_logs_or_cache(
    docker_client, built, server, tiny_model, records, cache_volume, containers
):
    build = built(NEW_TAG)
    for kind in ("server", "builder"):
        ref = build.image(kind)
        assert E2E_TOKEN not in json.dumps(docker_client.api.inspect_image(ref))
        assert E2E_TOKEN not in json.dumps(docker_client.api.history(ref))
    container = serve(containers, server, tiny_model, records, cache=cache_volume, env={"HF_TOKEN": E2E_TOKEN})
    wait_ready(container)
    generate(container)
    assert read_records(records, "trtllm-build")[0]["env"]["HF_TOKEN_SET"] is True
    assert E2E_TOKEN not in logs(container)
    scan = containers(server, entrypoint=["grep", "-rl", E2E_TOKEN, CACHE], volumes={cache_volume: {"bind": CACHE}})
    assert scan.wait(timeout=60)["StatusCode"] == 1, f"token found in the cache: {logs(scan)}"


def test_old_tag_builds_with_bundled_backend_assets_and_serves(docker_client, built, tiny_model, records, containers):
    build = built(OLD_TAG)
    server = build.image("server")
    probe = json.loads(docker_client.containers.run(server, command=["probe"], remove=True))
    assert probe["app_dir"] == "/opt/trtllm-images/app" and probe["templates"]["inflight_batcher_llm"]
    container = serve(containers, server, tiny_model, records)
    wait_ready(container)
    [build_call] = read_records(records, "trtllm-build")
    assert "max_seq_len" in flags_of(build_call) and "max_output_len" not in flags_of(build_call)
    generate(container)


def test_verification_rejects_a_different_tensorrt_llm(docker_client, standin, session_dir):
    installed = "0.16.0"
    base = standin(NEW_TAG, tensorrt_llm=installed, image=f"trtllm-standin:{NEW_TAG}-mismatch")
    work = session_dir / "mismatch"
    work.mkdir()
    matrix = matrix_for_standin(work / "matrix.yaml", NEW_TAG)
    # A registry prefix keeps these refs apart from the good images the other tests use.
    result = run_build(NEW_TAG, base.image, matrix, work / "out", registry="e2e-mismatch.invalid")
    try:
        assert result.returncode != 0
        assert f"tensorrt_llm: expected 0.17.0, found {installed}" in result.output
    finally:
        for image in docker_client.images.list(name="e2e-mismatch.invalid/*"):
            for tag in image.tags:
                docker_client.images.remove(tag, force=True)


def wait_for_line(container, marker: str, timeout_s: float = 120) -> str:
    """The first log line of `container` containing `marker`; fails with the logs if it never comes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [line for line in logs(container).splitlines() if marker in line]
        if found:
            return found[0]
        container.reload()
        if container.status not in ("created", "running"):
            break
        time.sleep(0.5)
    pytest.fail(f"no log line with {marker!r}:\n{logs(container)[-4000:]}")


def process_table(container) -> list[tuple[int, str, int, str]]:
    """(pid, state, parent pid, command line) of every process, as the container's own /proc shows them."""
    script = (
        "import os\n"
        "for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n"
        "    try:\n"
        "        stat = open(f'/proc/{pid}/stat').read()\n"
        "        args = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip()\n"
        "    except OSError:\n"
        "        continue\n"
        "    print(pid, *stat.rsplit(')', 1)[1].split()[:2], args, sep='\\t')\n"
    )
    output = container.exec_run(["python3", "-c", script]).output.decode()
    rows = [line.split("\t") for line in output.splitlines() if line.count("\t") == 3]
    return [(int(pid), state, int(ppid), args) for pid, state, ppid, args in rows if "python3 -c" not in args]


ECHO_CONFIG = """name: "echo"
backend: "python"
max_batch_size: 0
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# Slow to load, so that the server answers "not ready" for a while: the ready line must wait for it.
ECHO_MODEL = """import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(4)

    def execute(self, requests):
        answers = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            out = pb_utils.Tensor("text_output", np.array([text], dtype=object))
            answers.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return answers
"""


def echo_repository(root: Path) -> Path:
    """A complete model repository (served as given) whose one Python model echoes its prompt: a start that does
    not depend on the backend's pre/postprocessing code."""
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(ECHO_CONFIG)
    (root / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def server_process(container) -> tuple[int, str, int, str]:
    """The row of process_table() of the one tritonserver process (a typed command keeps its own argv[0])."""
    [row] = [row for row in process_table(container) if row[3].split(" ", 1)[0].endswith("tritonserver")]
    return row


def test_the_ready_line_tells_how_to_call_the_server_and_pid_1_reaps_its_watcher(server, containers, tmp_path):
    repository = echo_repository(tmp_path / "repository")
    container = containers(
        server,
        environment={"MODEL_ID": "/models/echo"},
        volumes={str(repository): {"bind": "/models/echo", "mode": "ro"}},
    )
    samples = []  # (server ready, ready line logged), until the line comes
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (samples and samples[-1][1]):
        container.reload()
        assert container.status == "running", logs(container)
        samples.append((ready_now(container), "info: ready " in logs(container)))
        time.sleep(0.3)
    assert samples[-1][1], logs(container)[-3000:]
    assert not [sample for sample in samples if sample == (False, True)], "the line came before readiness"
    assert samples[0] == (False, False), "the model loads slowly: there is a time before readiness"
    [line] = [line for line in logs(container).splitlines() if "info: ready " in line]
    assert "model=/models/echo source=repository tag=25.01 tensorrt_llm=" in line
    assert "http=http://localhost:8000 grpc=localhost:8001 metrics=http://localhost:8002/metrics" in line
    assert "served_model_name=echo" in line and "admin_key=random" in line and "frontend=triton" in line
    # The line's curl, pasted as a user would (the container's address for localhost), answered by the real server.
    command = line.split(" try=", 1)[1].replace("localhost", address(container))
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["text_output"] == PROMPT, done.stdout
    time.sleep(2)  # the watcher exited when it logged the line; PID 1 must have reaped it
    assert logs(container).count("info: ready ") == 1
    table = process_table(container)
    assert table[0][0] == 1 and table[0][3].startswith("/opt/trtllm-images/bin/tini -s -- "), table
    assert not [row for row in table if row[1] == "Z"], f"zombies: {table}"
    assert [row[0] for row in table if "trtllm-entrypoint" in row[3]] == [1], f"the watcher is still there: {table}"
    triton = server_process(container)
    assert triton[2] == 1, "the exec'd server is tini's own child, so it gets the SIGTERM that tini passes on"
    started = time.monotonic()
    container.stop(timeout=30)
    assert container.wait(timeout=30)["StatusCode"] == 0, logs(container)[-3000:]
    assert time.monotonic() - started < 25, "the server drained on SIGTERM instead of being killed"


def test_a_broken_filled_config_is_refused_in_the_container_before_triton_starts(
    server, tiny_model, records, containers, tmp_path
):
    templates = shutil.copytree(upstream_templates("0.17.0"), tmp_path / "all_models")
    broken = templates / "inflight_batcher_llm" / "postprocessing" / "config.pbtxt"
    broken.write_text(broken.read_text() + "\nno_such_field: 1\n")  # our own parser takes it; ModelConfig does not
    for path in [templates, *templates.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    container = containers(
        server,
        environment={"MODEL_ID": "/models/tiny", "DOUBLE_RECORD_DIR": "/records", "TEMPLATES_DIR": "/templates"},
        volumes={
            str(tiny_model): {"bind": "/models/tiny", "mode": "ro"},
            str(templates): {"bind": "/templates", "mode": "ro"},
            **record_mount(records),
        },
    )
    assert container.wait(timeout=120)["StatusCode"] == 1, logs(container)
    output = logs(container)
    [error] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "postprocessing/config.pbtxt: not a valid Triton ModelConfig" in error and "no_such_field" in error
    assert "protobuf check skipped" not in output
    assert "starting the server" not in output and "Started HTTPService" not in output


def test_frontend_openai_serves_the_official_client_healthy_and_stops_cleanly(
    server, tiny_sentencepiece_model, records, containers
):
    """FRONTEND=openai and nothing else: our OpenAI front on OPENAI_PORT beside tritonserver's own endpoints, asked by
    the official client (streamed and not); the HEALTHCHECK follows the front's /health/ready; docker stop drains.
    The model's tokenizer is SentencePiece-shaped: the answers are its decoding of the generated ids, spaces and all
    (the engine double answers the prompt's ids last to first)."""
    openai = pytest.importorskip("openai")
    tokenizers = pytest.importorskip("tokenizers")
    model = tiny_sentencepiece_model
    delay, max_tokens = "0.3", 8  # a stream of 2.4 s, in flight when the container is stopped
    container = serve(
        containers,
        server,
        model,
        records,
        env={"FRONTEND": "openai", "TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S": delay},
        mount=f"/models/{model.name}",  # as a user mounts a model: under its own name, MODEL_ID pointing there
    )
    assert wait_health_status(container, timeout_s=180) == "healthy", logs(container)[-3000:]
    api = openai.OpenAI(base_url=f"http://{address(container)}:9000/v1", api_key="unused", max_retries=0, timeout=60)
    listed = [entry.id for entry in api.models.list()]
    name = listed[0]  # the client asks for the name the front lists
    completion = api.completions.create(model=name, prompt=PROMPT, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as no_template:  # the tiny tokenizer has no chat_template
        api.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPT}], max_tokens=4)
    both = ready_now(container) and ready_now(container, route="/v2/models/ensemble/ready")

    def stream() -> list[str]:
        chunks = api.completions.create(model=name, prompt=PROMPT, max_tokens=max_tokens, stream=True)
        return [chunk.choices[0].text for chunk in chunks]

    request, outcome = in_background(stream)
    time.sleep(1.0)
    assert request.is_alive(), "the stream must still be in flight when the container is stopped"
    container.stop(timeout=40)
    request.join(timeout=30)
    tokenizer = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    answer = list(reversed(tokenizer.encode(PROMPT).ids))  # BOS included: the preprocessing model's ids
    generated = [answer[i % len(answer)] for i in range(max_tokens)]
    # MODEL_ID=/models/tiny-sentencepiece: served under its directory's name
    assert listed == [model.name] and completion.choices[0].text == tokenizer.decode(generated[:4]), completion
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 4
    assert both, "Triton's own HTTP endpoint answers beside the front"
    assert no_template.value.status_code == 400 and "chat_template" in no_template.value.response.text
    assert "error" not in outcome, f"{outcome.get('error')!r}\n{logs(container)[-3000:]}"
    assert "".join(outcome["result"]) == tokenizer.decode(generated), outcome["result"]
    assert container.wait(timeout=30)["StatusCode"] == 0, logs(container)[-3000:]
    output = logs(container)
    assert "has no chat_template" in output
    [line] = [line for line in output.splitlines() if "info: ready " in line]
    assert "openai=http://localhost:9000/v1 http=http://localhost:8000 grpc=localhost:8001" in line
