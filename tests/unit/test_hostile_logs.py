"""Hostile values on their way to stderr: URL credentials from any library, secrets JSON would escape, values that
would forge a line, and LOG_FORMAT=json covering every line the entrypoint's process writes."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.image import Image, templates_for
from trtllm_entrypoint import log as log_module
from trtllm_entrypoint.config.credentials import token_values
from trtllm_entrypoint.log import Log

REPO = Path(__file__).resolve().parents[2]
FORGED = ["\n[trtllm-entrypoint] info: ready", "\r[trtllm-entrypoint] info: x", "\x1b[2K", "\u2028x", "\x85x"]
PASSWORD = "Pa55-w0rd-of-the-mirror"
URLS = [
    f"http://user:{PASSWORD}@mirror.example",
    f"https://{PASSWORD}@mirror.example:8443/hub",
    f"HTTPS://user:{PASSWORD}@10.0.0.1/path?q=1",
    f"http://user:p@{PASSWORD}@host/",  # an unencoded '@' in the password: everything up to the last one
    f"socks5h://u:{PASSWORD}@proxy:1080",
]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_url_userinfo_is_masked_in_messages_and_fields(url, fmt):
    stream = io.StringIO()
    Log(fmt, stream).warn(f"HTTP Error 500 thrown while requesting HEAD {url}/api", endpoint=url)
    assert PASSWORD not in stream.getvalue()
    assert "***@" in stream.getvalue()


@pytest.mark.parametrize("secret", ['ab"cd\\ef-0123456789', 'only"quote-0123456789', "back\\slash-0123456789"])
def test_secrets_json_would_escape_are_masked_before_encoding(secret):
    stream = io.StringIO()
    log = Log("json", stream, secrets=(secret,), level="debug")
    log.debug("starting the server", argv=f"tritonserver --http-restricted-api=inference:admin-key={secret}")
    log.info(f"key {secret} in the message")
    out = stream.getvalue()
    for line in out.splitlines():
        json.loads(line)
    assert secret not in out and json.dumps(secret)[1:-1] not in out
    assert out.count("***") == 2


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("forged", FORGED)
def test_a_value_cannot_start_a_line_of_its_own(fmt, forged):
    stream = io.StringIO()
    Log(fmt, stream).info("model fetched" + forged, commit="0" * 40 + forged)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "\r" not in lines[0] and "\x1b" not in lines[0]


LIBRARY_LINES = """
import logging, sys, warnings
from trtllm_entrypoint.log import Log, capture_stderr
from trtllm_entrypoint.config.credentials import token_values
env = {"HF_ENDPOINT": sys.argv[2], "HF_TOKEN": "hf_secret_token_value"}
early = logging.getLogger("early.library")
early.addHandler(logging.StreamHandler())  # made before the capture, as a library configures itself on import
capture_stderr(Log(sys.argv[1], secrets=token_values(env)))
early.error("retrying %s with hf_secret_token_value", env["HF_ENDPOINT"])
hub = logging.getLogger("huggingface_hub.utils._http")
hub.warning("HTTP Error 500 thrown while requesting HEAD %s", env["HF_ENDPOINT"])
late = logging.getLogger("late.library")
late.addHandler(logging.StreamHandler())
late.warning("late handler: %s", env["HF_ENDPOINT"])
warnings.warn("insecure request to " + env["HF_ENDPOINT"], stacklevel=1)
print("a stray print: " + env["HF_ENDPOINT"], file=sys.stderr)
sys.stderr.write("no newline before exec: " + env["HF_ENDPOINT"])
sys.stderr.flush()
"""


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_library_line_on_stderr_is_masked_and_json_in_json_mode(fmt):
    result = subprocess.run(
        [sys.executable, "-c", LIBRARY_LINES, fmt, f"https://user:{PASSWORD}@mirror.example"],
        env={**os.environ, "PYTHONPATH": str(REPO / "entrypoints")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert PASSWORD not in result.stderr and "hf_secret_token_value" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 6, result.stderr
    assert all("https://***@mirror.example" in line for line in lines if "mirror" in line)
    if fmt == "json":
        for line in lines:
            assert isinstance(json.loads(line), dict), line


def test_the_early_log_masks_passwords_of_url_variables_alone_too():
    env = {"HTTPS_PROXY": f"http://proxyuser:{PASSWORD}@proxy:3128"}
    stream = io.StringIO()
    Log(stream=stream, secrets=token_values(env)).error(f"proxy refused the password {PASSWORD}")
    assert PASSWORD not in stream.getvalue()


class Refusing(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802  (http.server's name)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def failing_mirror():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://mirror-user:{PASSWORD}@127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.process
@pytest.mark.parametrize("fmt", ["json"])  # the client retries for about 20 s; text lines are covered above
def test_a_failing_authenticating_mirror_never_shows_its_password(tmp_path, failing_mirror, fmt):
    image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    result = image.run("prepare", MODEL_ID="org/model", HF_ENDPOINT=failing_mirror, LOG_FORMAT=fmt)
    assert result.returncode != 0
    assert PASSWORD not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    if fmt == "json":
        lines = result.stderr.splitlines()
        assert lines
        for line in lines:
            assert isinstance(json.loads(line), dict), line
        assert json.loads(lines[-1])["level"] == "error"
    else:
        assert "error:" in result.stderr


@pytest.mark.process
@pytest.mark.parametrize(
    "endpoint",
    [
        f"http://user:{PASSWORD}@host:99999",
        f"ftp://user:{PASSWORD}@host",
        f"http://user:{PASSWORD}@",
        f"http://user:{PASSWORD}@host/ with space",
        "huggingface.co",
    ],
)
def test_an_unusable_hf_endpoint_is_named_with_its_credentials_masked(tmp_path, endpoint):
    image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    result = image.run("prepare", MODEL_ID="org/model", HF_ENDPOINT=endpoint)
    assert result.returncode == 2
    assert "HF_ENDPOINT" in result.stderr
    assert "CACHE_DIR" not in result.stderr
    assert PASSWORD not in result.stderr


def test_the_log_module_escapes_what_it_masks():
    assert (
        log_module.mask_urls(f"see {URLS[0]}/x and {URLS[1]}")
        == "see http://***@mirror.example/x and https://***@mirror.example:8443/hub"
    )


@pytest.mark.process
@pytest.mark.parametrize("key", ['quote"0123456789abcdef', "back\\slash0123456789abc", "tab\there0123456789"])
def test_a_typed_admin_key_follows_the_admin_key_rule(tmp_path, key):
    image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    engine_dir = image.prebuilt()
    result = image.run(
        "tritonserver",
        f"--model-repo={engine_dir}",
        f"--http-restricted-api=logging:admin-key={key}",
        MODEL_ID="",
        LOG_LEVEL="debug",
        LOG_FORMAT="json",
    )
    assert result.returncode == 2, result.stderr
    assert key not in result.stderr and json.dumps(key)[1:-1] not in result.stderr
    assert "typed command" in json.loads(result.stderr.splitlines()[-1])["msg"]


def test_even_a_traceback_is_masked_and_json_lines(tmp_path, monkeypatch):
    """A bug's traceback is written while stderr is still captured: each line masked, one JSON object each."""
    from trtllm_entrypoint import main

    def bug(args, env):
        raise RuntimeError(f"unexpected while talking to https://u:{PASSWORD}@mirror")

    monkeypatch.setattr(main, "run", bug)
    real = sys.stderr
    sys.stderr = captured = io.StringIO()
    try:
        with pytest.raises(SystemExit) as exited:
            main.main(["serve"], {"LOG_FORMAT": "json"})
    finally:
        sys.stderr = real
    assert exited.value.code == 1
    lines = captured.getvalue().splitlines()
    assert len(lines) > 2 and PASSWORD not in captured.getvalue()
    assert all(isinstance(json.loads(line), dict) for line in lines)
