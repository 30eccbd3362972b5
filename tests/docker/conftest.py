"""Harness for the end-to-end tests: a real Docker engine, stand-in NGC images (a real tritonserver 2.51.0 and real
Open MPI; doubles for the engine and the GPU tools), our images built from them with `python build.py`, a tiny
Hugging Face checkpoint, and containers that are always removed afterwards.

No Docker engine → every test here is skipped with the reason, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from docker.models.containers import _create_container_args

from harness.build_standin import (
    SCRIPTS_DIR,
    Standin,
    StandinUnavailable,
    TemplatesMissing,
    build_standin,
    matrix_for_standin,
    upstream_templates,
)
from harness.doubles import double_environ, install_doubles, write_app
from harness.tiny_checkpoint import tiny_llama

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI") == "true"
BUILD_TIMEOUT_S = 900
# Set in the environment of every `build.py` run and of the token test's container: it must show up nowhere.
E2E_TOKEN = "hf_e2eDoNotLeakMe0123456789"


def unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"CI=true, so the Docker end-to-end tests must run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def docker_client():
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # any failure to reach the daemon means the same: no engine here
        unavailable(f"no Docker engine answers ({type(exc).__name__}: {exc}); start dockerd or set DOCKER_HOST")
    return client


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


# --- stand-ins and our images ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def standin(docker_client):
    """standin(tag, tensorrt_llm=None, image=None) -> Standin, built once per session and arguments."""
    built: dict[tuple, Standin | Exception] = {}

    def get(tag: str, *, tensorrt_llm: str | None = None, image: str | None = None) -> Standin:
        key = (tag, tensorrt_llm, image)
        if key not in built:
            try:
                built[key] = build_standin(
                    tag,
                    image=image,
                    tensorrt_llm=tensorrt_llm,
                    client=docker_client,
                    log=lambda msg: print(msg, file=sys.stderr),
                )
            except StandinUnavailable as exc:
                built[key] = exc
        result = built[key]
        if isinstance(result, Exception):
            # Upstream templates come from ../shared or the pinned sources (harness/upstream_files.py): CI must
            # have them.
            unavailable(f"stand-in for {tag}: {result}")
        return result

    return get


def backend_checkout(dest: Path, version: str) -> Path:
    """A local tensorrtllm_backend checkout (layout A) for --backend-dir: the stored upstream templates at
    `version`, plus TensorRT-LLM examples whose scripts run the doubles that every stand-in carries."""
    templates = upstream_templates(version)
    write_app(dest / "app", SCRIPTS_DIR, templates)
    (dest / "app" / "all_models").rename(dest / "all_models")
    (dest / "app" / "tools").rename(dest / "tools")
    (dest / "tensorrt_llm").mkdir()
    (dest / "app" / "examples").rename(dest / "tensorrt_llm" / "examples")
    (dest / "app").rmdir()
    return dest


@dataclass(frozen=True)
class Build:
    returncode: int
    output: str
    report: dict | None

    def image(self, kind: str) -> str:
        [ref] = [i["ref"] for i in self.report["images"] if i["kind"] == kind]
        return ref


def run_build(
    tag: str,
    base_image: str,
    matrix: Path,
    out: Path,
    *,
    backend_dir: Path | None = None,
    registry: str | None = None,
    multinode: bool = False,
) -> Build:
    argv = [
        sys.executable,
        "build.py",
        "--tag",
        tag,
        "--base-image",
        base_image,
        "--matrix",
        str(matrix),
        "--out",
        str(out),
    ]
    argv += ["--backend-dir", str(backend_dir)] if backend_dir else []
    argv += ["--registry", registry] if registry else []
    argv += ["--multinode"] if multinode else []
    done = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "HF_TOKEN": E2E_TOKEN},
    )
    report_path = out / "reports" / f"{tag}.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return Build(done.returncode, done.stdout + done.stderr, report)


@pytest.fixture(scope="session")
def built(standin, session_dir):
    """built(tag) -> Build of our server and builder images FROM the stand-in of `tag`, once per session;
    built(tag, multinode=True): and the group image (the server plus OpenSSH)."""
    builds: dict[tuple[str, bool], Build] = {}

    def get(tag: str, multinode: bool = False) -> Build:
        if (tag, multinode) not in builds:
            base = standin(tag)
            work = session_dir / (f"build-{tag}" + ("-multinode" if multinode else ""))
            work.mkdir()
            matrix = matrix_for_standin(work / "matrix.yaml", tag)
            backend = None
            if not base.spec.with_app:
                try:
                    backend = backend_checkout(work / "backend", base.spec.tensorrt_llm)
                except TemplatesMissing as exc:
                    unavailable(f"backend checkout for {tag}: {exc}")
            builds[tag, multinode] = run_build(
                tag, base.image, matrix, work / "out", backend_dir=backend, multinode=multinode
            )
        result = builds[tag, multinode]
        assert result.returncode == 0, f"python build.py --tag {tag} failed:\n{result.output[-4000:]}"
        return result

    return get


# --- models ---------------------------------------------------------------------------------------------------------


def _readable(model: Path) -> Path:
    for path in [model, *model.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by any container UID
    return model


@pytest.fixture(scope="session")
def tiny_model(session_dir) -> Path:
    return _readable(tiny_llama(session_dir / "models" / "tiny"))


@pytest.fixture(scope="session")
def tiny_sentencepiece_model(session_dir) -> Path:
    """The tiny Llama with a tokenizer shaped as Llama 2's and TinyLlama's (SentencePiece: `▁` word starts, byte
    fallback), as users' models are: text must keep its spaces and whole characters."""
    return _readable(tiny_llama(session_dir / "models" / "tiny-sentencepiece", tokenizer="llama2"))


@pytest.fixture(scope="session")
def prebuilt_engine(session_dir, tiny_model, standin) -> Path:
    """A KServe-style model directory: an engine for the 25.01 stand-in's TensorRT-LLM, plus the tokenizer files,
    made on the host with the same doubles (convert_checkpoint + trtllm-build)."""
    version = standin("25.01").spec.tensorrt_llm
    root = session_dir / "host-doubles"
    paths = install_doubles(root, trtllm_version=version, tensorrt_version="0", with_app=True, templates_src=None)
    env = double_environ(paths, root / "records")
    dest, ckpt = session_dir / "mnt-models", root / "ckpt"
    for argv in (
        [
            sys.executable,
            str(paths["app"] / "examples/llama/convert_checkpoint.py"),
            "--model_dir",
            str(tiny_model),
            "--output_dir",
            str(ckpt),
            "--dtype",
            "float16",
        ],
        ["trtllm-build", "--checkpoint_dir", str(ckpt), "--output_dir", str(dest)],
    ):
        subprocess.run(argv, env=env, check=True, capture_output=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (dest / name).write_bytes((tiny_model / name).read_bytes())
    for path in [dest, *dest.iterdir()]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    return dest


# --- containers -----------------------------------------------------------------------------------------------------


@pytest.fixture
def records(tmp_path) -> Path:
    """A host directory every double in the container records into (mounted at /records)."""
    path = tmp_path / "records"
    path.mkdir()
    path.chmod(0o777)  # containers run as 1000 or any --user
    return path


@pytest.fixture
def cache_volume(docker_client):
    """A fresh named volume for /var/cache/trtllm; Docker seeds it with the image's mode-1777 directory."""
    volume = docker_client.volumes.create(f"trtllm-e2e-cache-{uuid.uuid4().hex[:10]}")
    yield volume.name
    volume.remove(force=True)


@pytest.fixture
def containers(docker_client):
    """start(image, **docker_run_kwargs) -> Container (detached); all are force-removed after the test."""
    started = []

    def start(image: str, stop_timeout: int | None = None, **kwargs):
        if stop_timeout is None:
            container = docker_client.containers.run(image, detach=True, **kwargs)
        else:  # `docker run --stop-timeout`, which the SDK's run() does not take: create, then start
            create = _create_container_args({**kwargs, "image": image, "version": docker_client.api._version})
            container = docker_client.containers.get(
                docker_client.api.create_container(**create, stop_timeout=stop_timeout)["Id"]
            )
            started.append(container)
            container.start()
            container.reload()
            return container
        started.append(container)
        return container

    yield start
    for container in started:
        try:
            container.remove(force=True)
        except Exception as exc:  # already gone: nothing to clean
            print(f"cleanup of {container.short_id}: {exc}", file=sys.stderr)


def logs(container) -> str:
    return container.logs(stdout=True, stderr=True).decode(errors="replace")


def wait_ready(container, port: int = 8000, timeout_s: float = 120) -> None:
    """Until the server in `container` answers /v2/health/ready with 200; fails with its logs if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        if container.status not in ("created", "running"):
            pytest.fail(f"container exited ({container.attrs['State']['ExitCode']}) before ready:\n{logs(container)}")
        if ready_now(container, port):
            return
        time.sleep(0.5)
    pytest.fail(f"not ready on port {port} within {timeout_s}s:\n{logs(container)}")


def wait_health_status(container, wanted: str = "healthy", timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    status = "none"
    while time.monotonic() < deadline:
        container.reload()
        status = container.attrs["State"].get("Health", {}).get("Status", "none")
        if status == wanted:
            break
        time.sleep(0.5)
    return status


# Docker's HEALTHCHECK of the image, polled every second instead of every 15 s: the test stays short, and the
# image's own check command is what runs (an empty `test` inherits it).
FAST_HEALTHCHECK = {"interval": 1_000_000_000, "timeout": 5_000_000_000, "retries": 3, "start_period": 0}


def record_mount(records_dir: Path) -> dict:
    return {str(records_dir): {"bind": "/records", "mode": "rw"}}


# --- talking to the real server in a container ----------------------------------------------------------------------


def address(container) -> str:
    container.reload()
    return container.attrs["NetworkSettings"]["IPAddress"]


def http(
    container,
    route: str,
    body: dict | None = None,
    *,
    port: int = 8000,
    timeout_s: float = 60,
    headers: dict | None = None,
) -> dict:
    """GET (body None) or POST a JSON body to the server in `container`; the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{address(container)}:{port}{route}", data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        pytest.fail(f"{route} answered {exc.code}: {exc.read().decode(errors='replace')}\n{logs(container)[-3000:]}")


def ready_now(container, port: int = 8000, route: str = "/v2/health/ready") -> bool:
    """Whether the server in `container` answers `route` with 200 at this moment."""
    try:
        with urllib.request.urlopen(f"http://{address(container)}:{port}{route}", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def stream(container, route: str, body: dict, *, port: int = 8000) -> list[dict]:
    """The server-sent events of a generate_stream call, decoded."""
    request = urllib.request.Request(f"http://{address(container)}:{port}{route}", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return [json.loads(line[len(b"data: ") :]) for line in response if line.startswith(b"data: ")]


def in_background(function, *args, **kwargs) -> tuple[threading.Thread, dict]:
    """Run function(*args) in a thread; the dict gets "result" or "error" when it ends."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = function(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by the test that reads `outcome`
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def tokens(text: str) -> list[str]:
    """`text` split as the tiny checkpoint's tokenizer splits it (Whitespace pre-tokenizer)."""
    return re.findall(r"\w+|[^\w\s]+", text)


def processes(container) -> list[str]:
    """The command line of every process in `container` (from the host's view, as `docker top` shows it)."""
    top = container.top(ps_args="-o pid,args")  # docker top needs the pid column to pick the container's
    return [row[1] for row in top["Processes"]]
