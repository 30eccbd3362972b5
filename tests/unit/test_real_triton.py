"""Every repository `trtllm-entrypoint prepare` writes, loaded by a REAL tritonserver on this host (no Docker).

The server is Triton 2.51.0 (NGC 24.10's core, from PyPI's nvidia-pytriton wheel) for every template set, whatever
tag the set belongs to. Real: tritonserver and its flags, its config parser, the Python backend, the ensemble
scheduler, and our entrypoint's repository and command line. Doubles (tests/doubles): the engine, served by a
Python-based `tensorrtllm` backend, and the preprocessing/postprocessing/BLS and LLM-API model.py files, which the
stored upstream templates do not include.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests import realtriton
from tests.tiny_checkpoint import PROMPT, PROMPT_WORDS
from tests.unit.test_main import TEMPLATE_SETS, Image, templates_for
from tests.unit.test_real_triton_security import HEADER, KEY, prepared_argv

MAX_TOKENS = 4


def call(server: realtriton.RunningServer, route: str, body: dict, headers: dict | None = None) -> object:
    request = urllib.request.Request(
        f"{server.http_url}{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("templates,tag", TEMPLATE_SETS)
def test_prepared_repository_loads_and_generates_in_real_triton(tmp_path, real_triton, templates, tag):
    img = Image(tmp_path, tag, templates_for(templates))
    argv = prepared_argv(img, KEY)
    models = sorted(config.parent.name for config in img.repo.glob("*/config.pbtxt"))

    # Our command line as `serve` runs it (only the program path and the backend directory differ from the image's).
    with realtriton.start(real_triton, argv, log_dir=tmp_path) as server:
        with urllib.request.urlopen(f"{server.http_url}/v2", timeout=10) as response:
            version = json.loads(response.read())["version"]
        states = {m["name"]: m.get("state") for m in call(server, "/v2/repository/index", {}, {HEADER: KEY})}
        request = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""}
        answers = [
            call(server, f"/v2/models/{model}/generate", request)
            for model in ("ensemble", "tensorrt_llm_bls")
            if model in models
        ]
        assert server.stop() == 0, server.log()[-3000:]

    assert version == realtriton.TRITON_VERSION
    assert states == dict.fromkeys(models, "READY")
    # Tokenized, generated and detokenized by the real pipeline (ensemble, and BLS where written): MAX_TOKENS
    # words, all from the prompt.
    for answer in answers:
        words = answer["text_output"].split()
        assert len(words) == MAX_TOKENS and set(words) <= set(PROMPT_WORDS), answer
        print(
            f"{templates} on Triton {realtriton.TRITON_VERSION}: {answer['model_name']} {PROMPT!r} -> "
            f"{answer['text_output']!r}"
        )


def test_decoupled_repository_streams_one_event_per_token(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    with realtriton.start(real_triton, prepared_argv(img, KEY, DECOUPLED="true"), log_dir=tmp_path) as server:
        body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": "", "stream": True}
        request = urllib.request.Request(
            f"{server.http_url}/v2/models/ensemble/generate_stream", data=json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            events = [json.loads(line[len(b"data: ") :]) for line in response if line.startswith(b"data: ")]
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
