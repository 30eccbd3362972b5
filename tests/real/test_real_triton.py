"""Every repository `trtllm-entrypoint prepare` writes, loaded by a REAL tritonserver on this host (no Docker).

The server is Triton 2.51.0 (NGC 24.10's core, from PyPI's nvidia-pytriton wheel) for every template set, whatever
tag the set belongs to. Real: tritonserver and its flags, its config parser, the Python backend, the ensemble
scheduler, upstream's own preprocessing/postprocessing/BLS model.py files (tokenization and detokenization with
transformers, BLS with torch) wherever the stored upstream set has them, and our entrypoint's repository and
command line. Doubles (tests/doubles): the engine, served by a Python-based `tensorrtllm` backend, and the Python
models of the TensorRT-LLM >= 0.20 snapshot, which holds templates only; every test prints whose models it ran.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.request

import pytest

from harness import realtriton
from harness.doubles import python_models_origin
from harness.image import KEY, TEMPLATE_SETS, Image, prepared_argv, templates_for
from harness.tiny_checkpoint import PROMPT, PROMPT_WORDS
from tests.real.test_real_triton_security import HEADER
from trtllm_entrypoint.repository import parameters

MAX_TOKENS = 4
BLS = "tensorrt_llm_bls"
# Upstream's BLS lib/decode.py at v0.12.0 and v0.13.0 gives dataclass fields an `np.array([])` default, which
# Python >= 3.11 refuses ("mutable default … is not allowed"); their NGC images (24.08, 24.09) run Python 3.10.12
# (matrix.yaml), where it imports. The stub here runs the host's Python.
BLS_NEEDS_PYTHON_3_10 = {"v0.12.0", "v0.13.0"}


def call(server: realtriton.RunningServer, route: str, body: dict, headers: dict | None = None) -> object:
    request = urllib.request.Request(
        f"{server.http_url}{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def stream(server: realtriton.RunningServer, model: str, body: dict) -> list[dict]:
    """The events of one `generate_stream` request."""
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/{model}/generate_stream", data=json.dumps({**body, "stream": True}).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return [json.loads(line[len(b"data: ") :]) for line in response if line.startswith(b"data: ")]


def python_models(templates: str) -> str:
    origin = python_models_origin(templates_for(templates))
    print(f"{templates} on Triton {realtriton.TRITON_VERSION}: {origin} Python models")
    return origin


def bls_imports_here(templates: str) -> bool:
    return templates not in BLS_NEEDS_PYTHON_3_10 or sys.version_info < (3, 11)


@pytest.mark.parametrize("templates,tag", TEMPLATE_SETS)
def test_prepared_repository_loads_and_generates_in_real_triton(tmp_path, real_triton, templates, tag):
    origin = python_models(templates)
    assert origin == "upstream's" or templates == "triton_backend", origin
    img = Image(tmp_path, tag, templates_for(templates))
    with_bls = bls_imports_here(templates)
    argv = prepared_argv(img, KEY, ENABLE_BLS=str(with_bls).lower())
    models = sorted(config.parent.name for config in img.repo.glob("*/config.pbtxt"))
    # The tokenizer's BOS token in the prompt: its id comes back among the generated ones, and the answer must not
    # show it (postprocessing's skip_special_tokens, which we fill with the backend's default: true).
    prompt_ids = len(PROMPT_WORDS) + 1
    request = {"text_input": f"<s> {PROMPT}", "max_tokens": prompt_ids, "bad_words": "", "stop_words": ""}

    # Our command line as `serve` runs it (only the program path and the backend directory differ from the image's).
    with realtriton.start(real_triton, argv, log_dir=tmp_path) as server:
        with urllib.request.urlopen(f"{server.http_url}/v2", timeout=10) as response:
            version = json.loads(response.read())["version"]
        states = {m["name"]: m.get("state") for m in call(server, "/v2/repository/index", {}, {HEADER: KEY})}
        answers = {
            model: call(server, f"/v2/models/{model}/generate", request)
            for model in ("ensemble", BLS)
            if model in models
        }
        assert server.stop() == 0, server.log()[-3000:]
        log = server.log()

    assert version == realtriton.TRITON_VERSION
    # Upstream's models print a `${x}` they were given in a warning; only the one no value can fill may remain.
    warned = {name for line in log.splitlines() if "WARNING" in line for name in re.findall(r"\$\{(\w+)\}", line)}
    assert warned <= parameters.NO_VALUE_SAYS_THE_DEFAULT, [line for line in log.splitlines() if "${" in line]
    assert (BLS in models) == with_bls and states == dict.fromkeys(models, "READY")
    # Tokenized, generated and detokenized by the real pipeline, ensemble and BLS: each of the prompt's tokens once
    # (the engine double echoes them), the special one dropped from the text.
    for model, answer in answers.items():
        words = answer["text_output"].split()
        assert sorted(words) == sorted(PROMPT_WORDS), (model, answer)
        print(f"  {model}: {request['text_input']!r} -> {answer['text_output']!r}")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the refusal is Python 3.11's")
@pytest.mark.parametrize("templates", sorted(BLS_NEEDS_PYTHON_3_10))
def test_bls_of_v0_12_and_v0_13_needs_the_python_of_their_images(tmp_path, real_triton, templates):
    """Where upstream and this host differ, the difference is upstream's and Python's, not our fill's: the BLS model
    fails to import (Triton then refuses to start, strict readiness), while the rest of the set serves above."""
    img = Image(tmp_path, "24.08", templates_for(templates))
    with realtriton.start(real_triton, prepared_argv(img, KEY, ENABLE_BLS="true"), wait=False) as server:
        assert server.process.wait(timeout=120) != 0
        log = server.log()
    assert f"failed to load '{BLS}'" in log and "mutable default" in log and "decode.py" in log, log[-3000:]


@pytest.mark.parametrize("templates,tag", TEMPLATE_SETS)
def test_decoupled_repository_streams_one_event_per_token(tmp_path, real_triton, templates, tag):
    python_models(templates)
    img = Image(tmp_path, tag, templates_for(templates))
    with realtriton.start(real_triton, prepared_argv(img, KEY, DECOUPLED="true"), log_dir=tmp_path) as server:
        body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""}
        events = stream(server, "ensemble", body)
    pieces = [event["text_output"] for event in events]
    assert len(pieces) == MAX_TOKENS and set(pieces) <= set(PROMPT_WORDS), events


def test_prompt_longer_than_max_input_len_gets_an_error_and_the_server_keeps_serving(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    short = " ".join(PROMPT_WORDS[:3])
    argv = prepared_argv(img, KEY, MAX_INPUT_LEN="3", MAX_SEQ_LEN="16")
    with realtriton.start(real_triton, argv, log_dir=tmp_path) as server:
        with pytest.raises(urllib.error.HTTPError) as rejected:
            call(server, "/v2/models/ensemble/generate", {"text_input": PROMPT, "max_tokens": MAX_TOKENS})
        answer = call(server, "/v2/models/ensemble/generate", {"text_input": short, "max_tokens": MAX_TOKENS})
    assert rejected.value.code == 400 and "max_input_len" in rejected.value.read().decode()
    assert set(answer["text_output"].split()) <= set(PROMPT_WORDS[:3])


def test_llmapi_repository_loads_through_auto_complete_and_generates(tmp_path, real_triton):
    img = Image(tmp_path, "26.07", templates_for("triton_backend"))
    with realtriton.start(real_triton, prepared_argv(img, KEY, WORKFLOW="llmapi"), log_dir=tmp_path) as server:
        states = {m["name"]: m.get("state") for m in call(server, "/v2/repository/index", {}, {HEADER: KEY})}
        answer = call(
            server, "/v2/models/tensorrt_llm/generate", {"text_input": PROMPT, "sampling_param_max_tokens": MAX_TOKENS}
        )
    assert states == {"tensorrt_llm": "READY"}
    words = answer["text_output"].split()
    assert len(words) == MAX_TOKENS and set(words) <= set(PROMPT_WORDS), answer


@pytest.fixture(scope="module")
def triton_on_python_3_12() -> realtriton.Layout:
    """The real server with the stub of Python 3.12, the Python of NGC images from 24.12 (matrix.yaml), without torch
    (no CPU build of it for 3.12 here; only BLS needs it). Skips without a Python 3.12 and its shared libpython."""
    interpreter = realtriton.find_python("3.12")
    if interpreter is None:
        pytest.skip("no Python 3.12 on this machine (PATH or pyenv): the server's 3.12 stub needs its libpython")
    try:
        return realtriton.host_layout(python=interpreter, torch=False)
    except realtriton.RealTritonUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {interpreter} is here, so the 3.12 stub must run: {exc}")
        pytest.skip(f"real tritonserver with Python 3.12's stub unavailable: {exc}")


@pytest.mark.real_server  # its own fixture runs the real server
@pytest.mark.parametrize("decoupled", [False, True], ids=["default", "decoupled"])
def test_the_ensemble_generates_under_the_python_3_12_stub_of_newer_images(tmp_path, triton_on_python_3_12, decoupled):
    """The stub of Python >= 3.12 drops the outputs a request did not ask for after it released the GIL, and 3.12's
    allocator crashes freeing them there: an engine that answers more than the ensemble asks for kills its stub on
    every ensemble request ("Stub process 'tensorrt_llm_0_0' is not healthy"), which no 3.11 stub shows."""
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""}
    argv = prepared_argv(img, KEY, DECOUPLED=str(decoupled).lower())
    with realtriton.start(triton_on_python_3_12, argv, log_dir=tmp_path) as server:
        answers = [call(server, "/v2/models/ensemble/generate", body)["text_output"] for _ in range(3)]
        events = stream(server, "ensemble", body) if decoupled else []
        assert server.stop() == 0, server.log()[-3000:]
    for answer in answers:
        assert len(answer.split()) == MAX_TOKENS and set(answer.split()) <= set(PROMPT_WORDS), answers
    if decoupled:
        pieces = [event["text_output"] for event in events]
        assert len(pieces) == MAX_TOKENS and set(pieces) <= set(PROMPT_WORDS), events
