"""FRONTEND=openai for real, without Docker: the command line `trtllm-entrypoint prepare` prints, run by Triton's
OpenAI frontend (server r24.12's main.py, unmodified) on the real tritonserver 2.51.0 core, asked by the official
`openai` client. Real: the frontend, the in-process server, the Python backend and ensemble scheduler, our
repository and command line. Doubles: the engine (tests/doubles) and what the stored templates lack."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import urllib.request

import pytest

from tests import realopenai, realtriton
from tests.tiny_checkpoint import PROMPT, PROMPT_WORDS
from tests.unit.test_main import Image, templates_for
from trtllm_entrypoint import flagcheck

openai = pytest.importorskip("openai")

MAX_TOKENS = 4
SCHEMA_DEFAULT_MAX_TOKENS = 16
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
TAG, TEMPLATES = "25.01", "v0.17.0"


def prepared(img: Image, **env: str) -> tuple[list[str], dict]:
    """prepare's OpenAI command line (ports free on this host) and its whole output."""
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT")}
    result = img.run("prepare", **{"FRONTEND": "openai", "WORKFLOW": "engine", **ports, **env})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    out["stderr"] = result.stderr
    return out["argv"], out


def with_chat_template(img: Image) -> None:
    config = img.model / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": CHAT_TEMPLATE}))


def client(frontend: realopenai.RunningFrontend):
    return openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=60)


# Upstream's postprocessing joins the detokenized words without spaces ("?LLM-TensorRT"): read them back greedily.
_PROMPT_TOKEN = re.compile("|".join(re.escape(w) for w in sorted(PROMPT_WORDS, key=len, reverse=True)) + r"|\S+")


def words_of(text: str) -> list[str]:
    """The tokens of `text`; a piece that is no prompt token stays whole (and fails the callers' subset checks)."""
    return _PROMPT_TOKEN.findall(text)


def body(raised) -> str:
    """What the frontend answered, from the official client's error."""
    return raised.value.response.text


def test_the_official_client_gets_models_completions_and_chat_streamed_and_not(tmp_path, real_openai):
    img = Image(tmp_path, TAG, templates_for(TEMPLATES))
    with_chat_template(img)
    argv, out = prepared(img, SERVED_MODEL_NAME="tiny", DECOUPLED="true")
    assert "--enable-kserve-frontends" not in argv and "--backend=tensorrtllm" in argv
    assert out["health_url"].endswith(f":{out['plan']['health_port']}/health/ready")
    with realopenai.start(real_openai, argv, log_dir=tmp_path) as frontend:
        api = client(frontend)
        listed = sorted(model.id for model in api.models.list())
        completion = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS)
        streamed = [
            chunk.choices[0].text
            for chunk in api.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True)
        ]
        chat = api.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS
        )
        chat_stream = [
            chunk.choices[0].delta.content or ""
            for chunk in api.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, stream=True
            )
        ]
        unbounded = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}])
        zero = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=0)
        with pytest.raises(openai.BadRequestError) as unknown:
            api.completions.create(model="nope", prompt=PROMPT, max_tokens=MAX_TOKENS)
        with pytest.raises(openai.UnprocessableEntityError) as negative:
            api.completions.create(model="tiny", prompt=PROMPT, max_tokens=-1)
        with pytest.raises(openai.UnprocessableEntityError) as no_messages:
            api.chat.completions.create(model="tiny", messages=[], max_tokens=MAX_TOKENS, extra_body={"messages": 1})
        assert frontend.stop() == 0, frontend.log()[-3000:]

    # r24.12 lists every model of the repository: the inner ones are not hidden (only `tiny` answers usefully).
    assert "tiny" in listed and {"preprocessing", "postprocessing", "tensorrt_llm"} <= set(listed)
    for text in (completion.choices[0].text, "".join(streamed), chat.choices[0].message.content, "".join(chat_stream)):
        assert len(words_of(text)) == MAX_TOKENS and set(words_of(text)) <= set(PROMPT_WORDS), text
    assert len([piece for piece in streamed if piece]) == MAX_TOKENS  # one event per token
    # Without max_tokens, r24.12's request schema (OpenAI's own) defaults it to 16, so no default of ours is needed
    # (25.08 on, main.py's --default-max-tokens is 16 too); 0 generates nothing; a bad value is a 422 naming it.
    assert len(words_of(unbounded.choices[0].message.content)) == SCHEMA_DEFAULT_MAX_TOKENS
    assert zero.choices[0].text == ""
    # The frontend's own answer (the client's str() of it differs between openai releases).
    assert "max_tokens" in body(negative) and "messages" in body(no_messages)
    assert "nope" in body(unknown)


def test_a_model_without_a_chat_template_serves_completions_and_refuses_chat_with_400(tmp_path, real_openai):
    img = Image(tmp_path, TAG, templates_for(TEMPLATES))
    argv, out = prepared(img)
    assert "has no chat_template" in out["stderr"]
    with realopenai.start(real_openai, argv, log_dir=tmp_path) as frontend:
        api = client(frontend)
        completion = api.completions.create(model="ensemble", prompt=PROMPT, max_tokens=MAX_TOKENS)
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(
                model="ensemble", messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS
            )
    assert set(words_of(completion.choices[0].text)) <= set(PROMPT_WORDS)
    assert "chat_template" in body(refused) or "chat template" in body(refused)


def test_sigterm_lets_an_in_flight_stream_finish_then_exits_0(tmp_path, real_openai):
    img = Image(tmp_path, TAG, templates_for(TEMPLATES))
    argv, _ = prepared(img, DECOUPLED="true")
    tokens = 24
    with realopenai.start(real_openai, argv, log_dir=tmp_path) as frontend:
        api = client(frontend)
        pieces: list[str] = []
        first = threading.Event()

        def stream() -> None:
            for chunk in api.completions.create(model="ensemble", prompt=PROMPT, max_tokens=tokens, stream=True):
                pieces.append(chunk.choices[0].text)
                first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(60), frontend.log()[-3000:]
        frontend.process.send_signal(signal.SIGTERM)
        reader.join(120)
        code = frontend.process.wait(60)
    assert len([p for p in pieces if p]) == tokens, (pieces, frontend.log()[-3000:])
    assert code == 0, frontend.log()[-3000:]


def test_tp_size_2_serves_in_orchestrator_mode_from_one_process(tmp_path, real_openai):
    img = Image(tmp_path, TAG, templates_for(TEMPLATES))
    argv, out = prepared(img, TP_SIZE="2")
    # One frontend process with Triton in-process; TensorRT-LLM spawns its own workers (orchestrator mode).
    assert argv[0] == "python3" and "mpirun" not in argv and out["env"] == {"TRTLLM_ORCHESTRATOR": "1"}
    with realopenai.start(real_openai, argv, env={**os.environ, **out["env"]}, log_dir=tmp_path) as frontend:
        completion = client(frontend).completions.create(model="ensemble", prompt=PROMPT, max_tokens=MAX_TOKENS)
        log = frontend.log()
    assert set(words_of(completion.choices[0].text)) <= set(PROMPT_WORDS)
    assert "orchestrator for 2 workers" in log  # the engine (double) was loaded once, in orchestrator mode


def test_the_real_frontends_help_takes_our_plans_flags_and_catches_a_newer_tags(tmp_path, real_openai):
    from tests.unit.test_flagcheck import OPENAI, uses_for

    def real_help(argv) -> str:
        main = realopenai.frontend_dir() / "openai_frontend" / "main.py"
        command = [str(real_openai.venv / "bin" / "python3"), str(main), "--help"]
        done = subprocess.run(command, env=real_openai.environ(), capture_output=True, text=True, timeout=300)
        return done.stdout + done.stderr

    r2412, r2509 = uses_for("24.12")[OPENAI], uses_for("25.09")[OPENAI]
    good, newer = flagcheck.check([r2412, r2509], real_help)
    assert good.missing == () and good.error is None and good.unverified is None
    assert {"--openai-port", "--enable-kserve-frontends", "--backend"} <= set(good.use.flags)
    # 25.09's plans restrict the frontend's routes: r24.12's main.py (what this host runs) has no such flag.
    assert newer.missing == ("--openai-restricted-api",)


def test_health_tracks_the_frontends_port_and_route(tmp_path, real_openai):
    img = Image(tmp_path, TAG, templates_for(TEMPLATES))
    argv, out = prepared(img)
    state = tmp_path / "health-state"
    env = {"TMPDIR": str(state)}
    state.mkdir()
    with realopenai.start(real_openai, argv, log_dir=tmp_path, wait=False) as frontend:
        # `health` with nothing recorded asks OPENAI_PORT's /health/ready when FRONTEND=openai.
        checks = {"FRONTEND": "openai", "OPENAI_PORT": str(frontend.port)}
        before = img.run("health", **env, **checks).returncode
        frontend.wait_ready()
        after = img.run("health", **env, **checks).returncode
        with urllib.request.urlopen(out["health_url"], timeout=5) as response:
            direct = response.status
    assert (before, after, direct) == (1, 0, 200)
