"""docs/no-gpu.md as a user runs it: from a fresh clone, without a GPU and without GitHub, the page's own commands,
copied from the page, up to a first answer of the OpenAI API and Triton's generate endpoint.

Without the upstream files the stand-in build stops at once with one line that says what to do; with them carried
over (TRTLLM_UPSTREAM_DIR, as the page says) the stand-in, our images and the tiny model are built by the documented
commands, and the documented `docker run` serves. GitHub is unreachable for every command here (a proxy that refuses),
so nothing can pass by downloading what the page says to carry.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from harness import build_standin
from harness.upstream_files import UpstreamMissing, upstream_root
from trtllm_images.matrix import load

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "no-gpu.md"
TAG = "25.01"
NO_GITHUB = "http://127.0.0.1:9"  # a proxy that refuses: every download from GitHub fails at once


def page_blocks() -> list[list[str]]:
    """The page's bash blocks, each as its commands (continuation lines joined, comments kept for the shell)."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [[line for line in block.replace("\\\n", " ").splitlines() if line.strip()] for block in blocks]


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell: this Python's venv first on PATH, no test variables, GitHub unreachable. The download cache
    (tritonserver's wheels, the vendored files) is this machine's, as a user's second try would find it."""
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "DOCKER_HOST") if name in os.environ}
    keep["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{keep.get('PATH', '/usr/bin:/bin')}"
    return {**keep, "HTTPS_PROXY": NO_GITHUB, "https_proxy": NO_GITHUB, **extra}


def sh(command: str, cwd: Path, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of this commit, in a directory with nothing beside it (no ../shared)."""
    dest = tmp_path_factory.mktemp("fresh") / "trtllm-images"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", head.stdout.strip()], check=True)
    return dest


@pytest.fixture(scope="module")
def carried() -> Path:
    """The upstream files a user carries over: what this checkout has (a copy beside it, the env var, or the cache)."""
    entry = load().get(TAG)
    try:
        return upstream_root(build_standin.upstream_needs(entry))
    except UpstreamMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, so the upstream files are required: {exc}")
        pytest.skip(str(exc))


def test_the_page_has_the_commands_this_test_runs():
    commands, requests = page_blocks()
    assert [c.split("#")[0].split()[:3] for c in commands[:3]] == [
        ["python", "harness/build_standin.py", "--tag"],
        ["python", "build.py", "--tag"],
        ["python", "build.py", "tiny-model"],
    ]
    assert commands[3].startswith("docker run ") and "--gpus" not in commands[3]
    assert all(request.startswith("curl ") for request in requests)


def test_without_the_upstream_files_the_stand_in_build_says_what_to_do_at_once(clone, tmp_path):
    command = page_blocks()[0][0]
    started = time.monotonic()
    done = sh(command, clone, user_env(XDG_CACHE_HOME=str(tmp_path / "cache")), timeout=300)  # nothing cached
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and "TRTLLM_UPSTREAM_DIR" in errors[0] and "upstream fetch --out" in errors[0], done.stderr
    assert "keda" not in errors[0] and "kserve" not in errors[0], "only what the stand-in uses is fetched"
    assert done.stderr.startswith("step 1/4: upstream files"), done.stderr
    assert time.monotonic() - started < 60


def test_the_documented_commands_give_a_first_answer_without_gpu_or_github(clone, carried, docker_client):
    (commands, requests) = page_blocks()
    env = user_env(TRTLLM_UPSTREAM_DIR=str(carried))
    for command in commands[:3]:
        done = sh(command, clone, env)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        if "build_standin.py" in command:
            steps = re.findall(r"^step (\d)/4: ", done.stderr, re.M)
            assert steps == ["1", "2", "3", "4"], done.stderr[-3000:]
    name = f"first-answer-{uuid.uuid4().hex[:8]}"
    # Published on free host ports (the page's 8000 and 9000 may be taken here); nothing else changes.
    run = re.sub(r"-p (\d+):(\d+)", r"-p 127.0.0.1::\2", commands[3])
    run = run.replace("docker run --rm ", f"docker run -d --name {name} ", 1)
    assert f"--name {name}" in run
    started = sh(run, clone, env, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        container = docker_client.containers.get(name)
        deadline = time.monotonic() + 300
        while "info: ready " not in container.logs().decode(errors="replace"):
            container.reload()
            assert container.status == "running", container.logs().decode(errors="replace")[-4000:]
            assert time.monotonic() < deadline, container.logs().decode(errors="replace")[-4000:]
            time.sleep(1)
        ports = {
            int(inside.split("/")[0]): int(bound[0]["HostPort"])
            for inside, bound in container.attrs["NetworkSettings"]["Ports"].items()
            if bound
        }
        answers = []
        for request in requests:
            for port, host_port in ports.items():
                request = request.replace(f"localhost:{port}/", f"127.0.0.1:{host_port}/")
            done = sh(request, clone, {**env, "HTTPS_PROXY": "", "https_proxy": ""}, timeout=60)
            assert done.returncode == 0, (request, done.stderr)
            answers.append(json.loads(done.stdout))
        completion, generated = answers
        assert completion["choices"][0]["text"].strip() and completion["usage"]["completion_tokens"] == 8, completion
        assert generated["text_output"].strip(), generated
        container.stop(timeout=40)
        container.reload()
        assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode(errors="replace")[-3000:]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    assert shlex.split(commands[3])[-1].endswith("-standin")
