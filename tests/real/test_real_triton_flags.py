"""The flag table and its prefix rules against the REAL tritonserver 2.51.0 (harness/realtriton.py): the table is the
server's own option list, the server reads prefixes as server_args does, and a typed `tritonserver --model-repo=…`
naming an engine is served from a filled repository with the API restriction in place.

Real: tritonserver, its option parser, its Python backend, its restricted-API checks. Doubles (tests/doubles): the
engine, its backend, nvidia-smi and trtllm-build.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import realtriton
from harness.image import Image, templates_for
from harness.tiny_checkpoint import PROMPT_WORDS
from tests.real.test_real_triton_security import GENERATE, GRPC_HEADER, HEADER
from trtllm_entrypoint.config import server_args
from trtllm_entrypoint.errors import UsageError

HELP_FLAG = re.compile(r"^  (--[a-z0-9-]+)( <.*>)?$")


def real_help(layout: realtriton.Layout) -> dict[str, bool]:
    """Each option the real server's --help lists -> whether it takes a value."""
    done = subprocess.run([str(layout.binary), "--help"], env=layout.environ(), capture_output=True, text=True)
    found = {}
    for line in (done.stdout + done.stderr).splitlines():
        match = HELP_FLAG.match(line)
        if match:
            found[match.group(1)] = bool(match.group(2))
    return found


def test_the_flag_table_is_the_real_servers_option_list(real_triton):
    table = {flag.name: flag.value for flag in server_args.TRITONSERVER}
    assert real_help(real_triton) == table


def parser_verdict(layout: realtriton.Layout, arg: str) -> str:
    """How the real server's option parser takes `arg`: ambiguous, unrecognized, or accepted (it then goes on to
    fail on the missing repository, or serves nothing)."""
    done = subprocess.run(
        [str(layout.binary), arg, "--model-repository=/nonexistent-repository", "--exit-timeout-secs=0"],
        env=layout.environ(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    if "is ambiguous" in out:
        return "ambiguous"
    if "unrecognized option" in out:
        return "unrecognized"
    return "accepted"


@pytest.mark.parametrize(
    "arg",
    [
        "--model-repo=/nonexistent",
        "--model-st=/nonexistent",
        "--model=/nonexistent",
        "--http-p=18999",
        "--http=1",
        "--allow=true",
        "--log-verbose=0",
        "--no-such-option=1",
        "--grpc-use-ssl=false",
        "--disable",
    ],
)
def test_prefixes_are_read_as_the_real_server_reads_them(real_triton, arg):
    name = arg.partition("=")[0]
    try:
        ours = "accepted" if server_args.resolve(name, server_args.TRITONSERVER) else "unrecognized"
    except UsageError:
        ours = "ambiguous"
    assert parser_verdict(real_triton, arg) == ours


def real_server_environ(image: Image, layout: realtriton.Layout) -> dict[str, str]:
    """The image's environment with the real tritonserver first on PATH (the doubles stay for nvidia-smi)."""
    env = layout.environ(image.env)
    env["PATH"] = os.pathsep.join([str(layout.binary.parent), env["PATH"]])
    return env


def post(url: str, body: dict, headers: dict | None = None) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


KEY = "typed-admin-key-0123456789"


@pytest.mark.parametrize(
    "store, own",
    [("--model-repo", []), ("--model-st", [f"--http-restricted=logging,model-repository:{HEADER}={KEY}"])],
)
def test_a_typed_command_with_a_prefix_serves_a_filled_repository_on_the_real_server(tmp_path, real_triton, store, own):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    built = image.run("build-engine")
    assert built.returncode == 0, built.stderr
    engine_dir = Path(json.loads(built.stdout)["engine_dir"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (engine_dir / name).write_bytes((image.model / name).read_bytes())
    http, grpc, metrics = (realtriton.free_port() for _ in range(3))
    command = [
        "tritonserver",
        f"{store}={engine_dir}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        f"--backend-directory={real_triton.backends}",
        f"--cache-directory={real_triton.home / 'caches'}",
        *own,
    ]
    # LOG_LEVEL=debug: the exec'd command line is a debug line.
    env = {**real_server_environ(image, real_triton), "MODEL_ID": "", "WORKFLOW": "engine", "LOG_LEVEL": "debug"}
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trtllm_entrypoint", *command],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = realtriton.RunningServer(proc, command, http, grpc, log_path)
    try:
        server.wait_ready()
        request = urllib.request.Request(
            f"{server.http_url}/v2/models/ensemble/generate", data=json.dumps(GENERATE).encode()
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            words = json.loads(response.read())["text_output"].split()
        index = f"{server.http_url}/v2/repository/index"
        without_key = post(index, {})
        with_key = post(index, {}, {HEADER: KEY}) if own else None
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_repository_index()
        if own:  # the typed HTTP restriction was completed for gRPC, with the same key
            assert client.get_model_repository_index(headers={GRPC_HEADER: KEY}) is not None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    text = log_path.read_text(errors="replace")
    assert "preparing one from it" in text and f"{store}={image.repo}" in text  # our log line, before the exec
    assert set(words) <= set(PROMPT_WORDS) and words
    assert without_key == 403 and refused.value.status() == "StatusCode.UNAVAILABLE"
    if own:
        assert with_key == 200
        assert KEY not in text
