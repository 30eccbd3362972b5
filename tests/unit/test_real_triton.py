"""Every repository `trtllm-entrypoint prepare` writes, loaded by a REAL tritonserver on this host (no Docker).

The server is Triton 2.51.0 (NGC 24.10's core, from PyPI's nvidia-pytriton wheel) for every template set, whatever
tag the set belongs to. Real: tritonserver and its flags, its config parser, the Python backend, the ensemble
scheduler, and our entrypoint's repository and command line. Doubles (tests/doubles): the engine, served by a
Python-based `tensorrtllm` backend, and the preprocessing/postprocessing/BLS model.py files, which the stored
upstream templates do not include.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests import realtriton
from tests.tiny_checkpoint import PROMPT, PROMPT_WORDS
from tests.unit.test_main import TEMPLATE_SETS, Image, templates_for

MAX_TOKENS = 4


def call(server: realtriton.RunningServer, route: str, body: dict) -> object:
    request = urllib.request.Request(f"{server.http_url}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("templates,tag", TEMPLATE_SETS)
def test_prepared_repository_loads_and_generates_in_real_triton(tmp_path, real_triton, templates, tag):
    img = Image(tmp_path, tag, templates_for(templates))
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")}
    result = img.run("prepare", WORKFLOW="engine", **ports)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    models = sorted(config.parent.name for config in img.repo.glob("*/config.pbtxt"))

    # Our command line as it is (only the program path and the backend directory differ from the image's).
    with realtriton.start(real_triton, argv, log_dir=tmp_path) as server:
        with urllib.request.urlopen(f"{server.http_url}/v2", timeout=10) as response:
            version = json.loads(response.read())["version"]
        states = {m["name"]: m.get("state") for m in call(server, "/v2/repository/index", {})}
        answer = call(server, "/v2/models/ensemble/generate",
                      {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""})
        assert server.stop() == 0, server.log()[-3000:]

    assert version == realtriton.TRITON_VERSION
    assert states == dict.fromkeys(models, "READY")
    # Tokenized, generated and detokenized by the real pipeline: MAX_TOKENS words, all from the prompt.
    words = answer["text_output"].split()
    assert len(words) == MAX_TOKENS and set(words) <= set(PROMPT_WORDS), answer
    print(f"{templates} on Triton {realtriton.TRITON_VERSION}: {PROMPT!r} -> {answer['text_output']!r}")


def test_decoupled_repository_streams_one_event_per_token(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT")}
    result = img.run("prepare", WORKFLOW="engine", DECOUPLED="true", **ports)
    assert result.returncode == 0, result.stderr
    with realtriton.start(real_triton, json.loads(result.stdout)["argv"], log_dir=tmp_path) as server:
        body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": "", "stream": True}
        request = urllib.request.Request(f"{server.http_url}/v2/models/ensemble/generate_stream",
                                         data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            events = [json.loads(line[len(b"data: "):]) for line in response if line.startswith(b"data: ")]
    pieces = [event["text_output"] for event in events]
    assert len(pieces) == MAX_TOKENS and set(pieces) <= set(PROMPT_WORDS), events
