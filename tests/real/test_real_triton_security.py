"""Secure by default, proven on a REAL tritonserver 2.51.0 (harness/realtriton.py) with the repository and the command
line `trtllm-entrypoint prepare` makes: the admin APIs answer only with the key, over HTTP and gRPC, while generate,
health and metadata stay open; and code planted in the cached repository never runs.

Real: tritonserver, its flags, its Python backend and its import of model.py. Doubles (tests/doubles): the engine and
the Python models' model.py files, which the stored upstream templates lack.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import realtriton
from harness.image import KEY, Image, prepared_argv, templates_for
from harness.tiny_checkpoint import PROMPT, PROMPT_WORDS

HEADER = realtriton.ADMIN_HEADER
GRPC_HEADER = "triton-grpc-protocol-admin-key"
# (method, route, body): every restricted API by default, including the writes an attacker would use.
RESTRICTED = [
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/systemsharedmemory/region/x/register", {"key": "/x", "offset": 0, "byte_size": 8}),
    ("GET", "/v2/cudasharedmemory/status", None),
    ("GET", "/v2/logging", None),
    ("POST", "/v2/logging", {"log_verbose_level": 1}),
    ("GET", "/v2/models/stats", None),
    ("GET", "/v2/trace/setting", None),
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/models/ensemble/unload", {}),
]
OPEN = [
    ("GET", "/v2/health/ready", None),
    ("GET", "/v2/health/live", None),
    ("GET", "/v2", None),
    ("GET", "/v2/models/ensemble", None),
    ("GET", "/v2/models/ensemble/config", None),
]
GENERATE = {"text_input": PROMPT, "max_tokens": 4, "bad_words": "", "stop_words": ""}


def status(
    server: realtriton.RunningServer, method: str, route: str, body: dict | None, headers: dict | None = None
) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{server.http_url}{route}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def generate(server: realtriton.RunningServer) -> list[str]:
    """The generated words; without a key, as any client sends it."""
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/ensemble/generate", data=json.dumps(GENERATE).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        words = json.loads(response.read())["text_output"].split()
    assert len(words) == GENERATE["max_tokens"] and set(words) <= set(PROMPT_WORDS), words
    return words


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


def test_admin_apis_answer_only_with_the_key_and_serving_stays_open(tmp_path, real_triton, image):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    with realtriton.start(real_triton, prepared_argv(image, KEY), log_dir=tmp_path) as server:
        open_routes = {route: status(server, method, route, body) for method, route, body in OPEN}
        generate(server)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready() and client.is_model_ready("ensemble")
        assert client.get_model_metadata("ensemble").name == "ensemble"
        admin_calls = {
            "shared memory": client.get_system_shared_memory_status,
            "logging": client.get_log_settings,
            "statistics": client.get_inference_statistics,
            "trace": client.get_trace_settings,
            "repository": client.get_model_repository_index,
        }
        refused = {}
        for name, call in admin_calls.items():
            with pytest.raises(InferenceServerException) as error:
                call()
            refused[name] = (error.value.status(), "restricted" in error.value.message())
            call(headers={GRPC_HEADER: KEY})  # answers with the key
        # Last, because with the key they act (verbose logging on).
        without = {(method, route): status(server, method, route, body) for method, route, body in RESTRICTED}
        wrong = {
            (method, route): status(server, method, route, body, {HEADER: "not-the-key"})
            for method, route, body in RESTRICTED
        }
        with_key = {
            (method, route): status(server, method, route, body, {HEADER: KEY}) for method, route, body in RESTRICTED
        }
        log = server.log()
        assert server.stop() == 0, log[-3000:]

    assert set(open_routes.values()) == {200}, open_routes
    assert set(refused.values()) == {("StatusCode.UNAVAILABLE", True)}, refused
    assert set(without.values()) == {403} and set(wrong.values()) == {403}, (without, wrong)
    assert 403 not in with_key.values(), with_key
    # (unload answers 503 with the key: model control mode "none" allows no unload, and that is Triton's answer)
    assert with_key["POST", "/v2/logging"] == with_key["POST", "/v2/repository/index"] == 200, with_key
    assert KEY not in log  # Triton does not log it either


def test_restricted_apis_none_opens_them(tmp_path, real_triton, image):
    with realtriton.start(real_triton, prepared_argv(image, RESTRICTED_APIS="none"), log_dir=tmp_path) as server:
        opened = {
            route: status(server, method, route, body)
            for method, route, body in (RESTRICTED[0], RESTRICTED[3], RESTRICTED[5])
        }
        generate(server)
    assert set(opened.values()) == {200}, opened


def test_without_a_key_the_printed_command_fails_closed(tmp_path, real_triton, image):
    argv = prepared_argv(image)  # no key: `serve` would use a random one; prepare prints none
    restricted = [arg for arg in argv if arg.startswith(("--http-restricted", "--grpc-restricted"))]
    assert restricted and all(arg.endswith(f":{HEADER}=") for arg in restricted), argv
    with pytest.raises(RuntimeError, match="option format"), realtriton.start(real_triton, argv, log_dir=tmp_path):
        pass


def marker_code(marker: Path, source: str) -> str:
    """The model's own code, plus a line that records that it ran."""
    return f"open({str(marker)!r}, 'w').write('planted code ran')\n" + source


def planted_bytecode(model_py: Path, code: str) -> Path:
    """A .pyc that Python takes for model.py's: it carries model.py's mtime and size, and other code."""
    stat = model_py.stat()
    header = (
        importlib.util.MAGIC_NUMBER
        + (0).to_bytes(4, "little")
        + int(stat.st_mtime).to_bytes(4, "little")
        + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    )
    pyc = model_py.parent / "__pycache__" / f"model.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(header + marshal.dumps(compile(code, str(model_py), "exec")))
    return pyc


@pytest.mark.parametrize("plant", ["model.py", "bytecode"])
def test_code_planted_in_the_cached_repository_never_runs(tmp_path, real_triton, image, plant):
    marker = tmp_path / "planted-code-ran"
    argv = prepared_argv(image, KEY, REPOSITORY_DIR="")
    repo = Path(next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--model-repository=")))
    model_py = repo / "preprocessing" / "1" / "model.py"
    source = model_py.read_text()
    if plant == "model.py":
        model_py.write_text(marker_code(marker, source))
    else:  # model.py stays byte for byte the image's; only Python's bytecode cache is planted
        planted_bytecode(model_py, marker_code(marker, source))

    # Control: started on the cache as the attacker left it, the real server runs the planted code.
    (tmp_path / "control").mkdir()
    with realtriton.start(real_triton, argv, log_dir=tmp_path / "control"):
        pass
    assert marker.read_text() == "planted code ran"
    marker.unlink()

    # The next start (entrypoint, then server) finds the change, rebuilds or cleans, and the planted code never runs.
    result = image.run("prepare", WORKFLOW="engine", REPOSITORY_DIR="", TRITON_ADMIN_KEY=KEY)
    assert result.returncode == 0, result.stderr
    if plant == "model.py":
        assert "files=preprocessing/1/model.py" in result.stderr
    assert not list(repo.rglob("__pycache__"))
    (tmp_path / "after").mkdir()
    with realtriton.start(real_triton, argv, log_dir=tmp_path / "after") as server:
        generate(server)
    assert model_py.read_text() == source
    assert not marker.exists()
