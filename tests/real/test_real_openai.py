"""FRONTEND=openai for real, without Docker: the plan `trtllm-entrypoint prepare` prints with only MODEL_ID and
FRONTEND=openai set (tritonserver's command line and our OpenAI front's), run by the entrypoint's supervisor with the
real tritonserver 2.51.0, asked by the official `openai` client, streamed and not. Real: tritonserver, the Python
backend and ensemble scheduler, upstream's Python models where the stored set has them (the llmapi model and the
TensorRT-LLM >= 0.20 pre/postprocessing are doubles: tests/doubles), upstream's config.pbtxt files, our front.
Doubles: the engine."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import urllib.error
import urllib.request

import pytest

from harness import realfront, realtriton
from harness.image import Image, templates_for
from harness.tiny_checkpoint import PROMPT, PROMPT_WORDS
from trtllm_entrypoint import contract

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

KEY = "openai-front-admin-key-0123456789"
MODEL = "tiny"  # the model directory's name (harness.image): the name FRONTEND=openai serves it under
MAX_TOKENS = 4
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
# (tag, templates, workflow): each template family, and both workflows; the workflow is the tag's default.
SERVED = [("25.01", "v0.17.0", "engine"), ("25.08", "triton_backend", "engine"), ("26.07", "triton_backend", "llmapi")]


def prepared(img: Image, **env: str) -> dict:
    """prepare's output for a user's start (free ports here), the key put back that it leaves out."""
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT")}
    result = img.run("prepare", **{"FRONTEND": "openai", "TRITON_ADMIN_KEY": KEY, **ports, **env})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    out["stderr"] = result.stderr
    return out


def status_of(url: str) -> int:
    """The status a POST without the admin key gets."""
    try:
        return urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), timeout=10).status  # noqa: S310
    except urllib.error.HTTPError as error:
        return error.code


def with_chat_template(img: Image) -> None:
    config = img.model / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": CHAT_TEMPLATE}))


def client(front: realfront.RunningFront, key: str = "unused"):
    return openai.OpenAI(base_url=f"{front.url}/v1", api_key=key, max_retries=0, timeout=60)


# Upstream's postprocessing joins the detokenized words without spaces ("?LLM-TensorRT"): read them back greedily.
_PROMPT_TOKEN = re.compile("|".join(re.escape(w) for w in sorted(PROMPT_WORDS, key=len, reverse=True)) + r"|\S+")


def words_of(text: str) -> list[str]:
    return _PROMPT_TOKEN.findall(text)


@pytest.mark.parametrize("tag,templates,workflow", SERVED)
def test_the_official_client_streams_and_gets_whole_answers_with_only_frontend_openai_set(
    tmp_path, real_triton, tag, templates, workflow
):
    img = Image(tmp_path, tag, templates_for(templates))
    with_chat_template(img)
    out = prepared(img)
    name = out["ready"]["served_model_name"]
    assert name == img.model.name == MODEL  # the model's own name, as vLLM serves it; Triton's is the entry model's
    entry_model = out["front"]["plan"]["entry_model"]
    assert out["ready"]["workflow"] == workflow and out["front"]["workers"] >= 1
    # Streaming follows from FRONTEND=openai: the engine model (or the llmapi model's model.yaml) is decoupled.
    policy = (img.repo / "tensorrt_llm" / ("1/model.yaml" if workflow == "llmapi" else "config.pbtxt")).read_text()
    assert re.search(r"decoupled:\s*(true|True)", policy)
    messages = [{"role": "user", "content": PROMPT}]
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        api = client(front)
        listed = [model.id for model in api.models.list()]
        completion = api.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS)
        chunks = list(
            api.completions.create(
                model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}
            )
        )
        chat = api.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS)
        chat_chunks = list(
            api.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS, stream=True)
        )
        if workflow == "engine":  # the ensemble returns each token's log-probability (the engine double's: 0)
            logprobs = api.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS, logprobs=True)
            chosen = [(entry.token, entry.logprob) for entry in logprobs.choices[0].logprobs.content]
        else:  # the llmapi model returns none per token: refused, not ignored
            with pytest.raises(openai.BadRequestError) as refused:
                api.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS, logprobs=True)
            chosen = refused.value.response.json()["error"]["param"]
        # Both APIs at once: Triton's own answers beside the front.
        native = urllib.request.urlopen(f"{front.triton_url}/v2/models/{entry_model}", timeout=10).status  # noqa: S310
        # Loading and unloading stay closed without the key, by default: Triton's model-repository API wants it, and
        # the front has no such route.
        bases = (f"{front.triton_url}/v2/repository/models/{entry_model}", f"{front.url}/v1/models/{name}")
        control = [status_of(f"{base}/{verb}") for verb in ("load", "unload") for base in bases]
        assert front.stop() == 0, front.log()[-3000:]

    assert listed == [name]  # only what can be asked for
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    chat_streamed = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    for text in (completion.choices[0].text, streamed, chat.choices[0].message.content, chat_streamed):
        assert len(words_of(text)) == MAX_TOKENS and set(words_of(text)) <= set(PROMPT_WORDS), text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) == MAX_TOKENS  # one event per token
    assert completion.choices[0].finish_reason == "length" and chat.choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_TOKENS
    assert completion.usage.prompt_tokens == len(PROMPT_WORDS) and completion.usage.completion_tokens == MAX_TOKENS
    assert [c.choices[0].finish_reason for c in chat_chunks][-1] == "length"
    assert native == 200
    assert control == [403, 404, 403, 404], control  # Triton refuses; the front has no such route
    if workflow == "engine":
        assert len(chosen) == MAX_TOKENS and all(isinstance(lp, float) for _, lp in chosen), chosen
    else:
        assert chosen == "logprobs"


def test_stop_sequences_n_seed_sampling_and_errors_in_openais_shape(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img)
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        api = client(front)
        # The engine double answers the prompt's tokens last to first: "?", "LLM", "-", "TensorRT", …
        stopped = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=["-"])
        stopped_stream = list(api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop="-", stream=True))
        several = api.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2, n=2, seed=7, temperature=0.5, top_p=0.9,
            presence_penalty=0.1, frequency_penalty=0.1, extra_body={"top_k": 3},
        )  # fmt: skip
        errors = {}
        for label, call in {
            "model": lambda: api.completions.create(model="nope", prompt=PROMPT, max_tokens=1),
            "max_tokens": lambda: api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-1),
            "chat_template": lambda: api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}]
            ),
            "tools": lambda: api.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
            ),  # fmt: skip
        }.items():
            with pytest.raises(openai.APIStatusError) as raised:
                call()
            errors[label] = (raised.value.status_code, raised.value.response.json()["error"])
    # The tiny model's word-level tokenizer has no decoder: its decoding joins tokens with a space, which stays
    # before the stop sequence (cut exactly).
    assert stopped.choices[0].text == "? LLM " and stopped.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in stopped_stream) == "? LLM "
    assert stopped_stream[-1].choices[0].finish_reason == "stop"
    assert [c.index for c in several.choices] == [0, 1] and several.usage.completion_tokens == 4
    assert errors["model"][0] == 404 and errors["model"][1]["code"] == "model_not_found"
    assert errors["max_tokens"][0] == 400 and errors["max_tokens"][1]["param"] == "max_tokens"
    assert errors["chat_template"][0] == 400 and "chat_template" in errors["chat_template"][1]["message"]
    assert errors["tools"][0] == 400 and errors["tools"][1]["param"] == "tools"
    assert all(set(e) == {"message", "type", "param", "code"} for _, e in errors.values())


def test_a_chat_without_max_tokens_takes_the_rest_of_the_context(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    with_chat_template(img)
    out = prepared(img, MAX_SEQ_LEN="16", MAX_INPUT_LEN="8")
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        api = client(front)
        chat = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}])
        with pytest.raises(openai.BadRequestError) as full:
            api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": " ".join(["is"] * 16)}])
    assert chat.usage.prompt_tokens == len(PROMPT_WORDS) and chat.usage.total_tokens == 16
    assert chat.choices[0].finish_reason == "length"
    assert full.value.response.json()["error"]["param"] == "messages"


def test_restricted_inference_wants_the_admin_key_as_the_api_key(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img, RESTRICTED_APIS="inference,metadata,model-repository")
    assert not any(KEY in arg for arg in out["front"]["argv"])
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        with pytest.raises(openai.AuthenticationError):
            client(front, "wrong-key").completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            client(front).models.list()
        answer = client(front, KEY).completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS)
        ready = urllib.request.urlopen(f"{front.url}/health/ready", timeout=10).status  # noqa: S310
        log = front.log()
    assert len(words_of(answer.choices[0].text)) == MAX_TOKENS and ready == 200
    assert KEY not in log


def test_sigterm_lets_an_in_flight_stream_finish_then_exits_0(tmp_path, real_triton):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    out = prepared(img)
    tokens = 24
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        api = client(front)
        pieces: list[str] = []
        first = threading.Event()

        def stream() -> None:
            for chunk in api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=tokens, stream=True):
                pieces.append(chunk.choices[0].text)
                first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(60), front.log()[-3000:]
        front.process.send_signal(signal.SIGTERM)
        reader.join(120)
        code = front.process.wait(60)
    assert len([p for p in pieces if p]) == tokens, (pieces, front.log()[-3000:])
    assert code == 0, front.log()[-3000:]
    log = front.log()
    # The worker says what its drain does: the streams in flight when it started (the double may have sent all
    # 24 tokens by then), and that each of them finished, none cut.
    started = re.search(r"info: draining the OpenAI front streams_in_flight=(\d+) grace_s=", log)
    assert started, log[-3000:]
    assert f"info: drain done finished={started.group(1)} cut=0 " in log, log[-3000:]


@pytest.mark.process
def test_decoupled_false_is_refused_before_any_download(tmp_path):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    result = img.run("prepare", FRONTEND="openai", DECOUPLED="false", MODEL_ID="org/never-downloaded")
    assert result.returncode == 2
    assert "DECOUPLED=false cannot serve FRONTEND=openai" in result.stderr and "download" not in result.stderr


# Prompts whose characters take several tokens (accents outside the vocabulary, emoji, CJK) and runs of spaces.
EXACT_PROMPTS = (
    "Le café est très bon à Noël, naïve Zürich",
    "Emoji 😀 👍🏽 ❤️ and 中文 你好，世界 こんにちは",
    "  spaces  between   words and a tab\there",
)


@pytest.mark.parametrize("shape", ["llama2", "qwen"])
@pytest.mark.parametrize(
    "tag,templates,workflow", [("25.01", "v0.17.0", "engine"), ("26.07", "triton_backend", "llmapi")]
)
def test_answers_are_exactly_the_tokenizers_decoding_of_the_generated_ids(
    tmp_path, real_triton, shape, tag, templates, workflow
):
    """Through the official client, whole and streamed: the concatenated deltas equal the whole answer, which equals
    the tokenizer's decoding of the generated ids as a whole (skip_special_tokens, as served) and the native API's
    whole answer; no chunk holds a `�`. The engine double echoes the prompt's ids (TRTLLM_ENGINE_DOUBLE_ECHO), so
    the generated ids are the prompt's, BOS included where the tokenizer adds one, and wrap around once."""
    tokenizers = pytest.importorskip("tokenizers")
    img = Image(tmp_path, tag, templates_for(templates), tokenizer=shape)
    out = prepared(img)
    out["argv"].append(realtriton.private_backends(real_triton, tmp_path))  # this checkout's engine double (echo)
    name = out["ready"]["served_model_name"]
    tokenizer = tokenizers.Tokenizer.from_file(str(img.model / "tokenizer.json"))
    results = []
    echo = {**os.environ, "TRTLLM_ENGINE_DOUBLE_ECHO": "1"}
    with realfront.start(real_triton, out, KEY, env=echo, log_dir=tmp_path) as front:
        api = client(front)
        for prompt in EXACT_PROMPTS:
            ids = tokenizer.encode(prompt).ids
            max_tokens = len(ids) + 3  # past the end of the prompt's ids: the answer starts them again
            whole = api.completions.create(model=name, prompt=prompt, max_tokens=max_tokens)
            chunks = [
                c.choices[0].text
                for c in api.completions.create(model=name, prompt=prompt, max_tokens=max_tokens, stream=True)
                if c.choices
            ]
            native = native_answer(front, workflow, contract.ENTRY_MODEL[workflow], prompt, max_tokens)
            results.append((prompt, ids, max_tokens, whole, chunks, native))
    for prompt, ids, max_tokens, whole, chunks, native in results:
        generated = [ids[i % len(ids)] for i in range(max_tokens)]
        decoded = tokenizer.decode(generated, skip_special_tokens=True)
        assert whole.choices[0].text == "".join(chunks) == decoded == native, (prompt, chunks)
        assert not any("\ufffd" in chunk for chunk in chunks), chunks
        if workflow == "engine":  # the front's own ids: usage is exact
            assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), max_tokens)


def native_answer(front: realfront.RunningFront, workflow: str, name: str, prompt: str, max_tokens: int) -> str:
    """The same prompt's whole answer from tritonserver's own generate endpoint (upstream's postprocessing decodes
    all ids at once; the llmapi model's LLM API decodes)."""
    body = {"text_input": prompt, "max_tokens": max_tokens}
    if workflow == "llmapi":
        body = {"text_input": prompt, "sampling_param_max_tokens": max_tokens}
    request = urllib.request.Request(
        f"{front.triton_url}/v2/models/{name}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "admin-key": KEY},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:  # noqa: S310
        return str(json.loads(reply.read())["text_output"])


def test_llmapi_stops_are_cut_exactly_on_the_text(tmp_path, real_triton):
    """The llmapi model's LLM API matches a stop string as its token ids and trims them from its text, after the
    text of a stop's first tokens has been streamed (its double does the same): the front cuts stops on the text
    itself, whole and streamed, and the answer ends exactly before the stop."""
    img = Image(tmp_path, "26.07", templates_for("triton_backend"), tokenizer="qwen")
    out = prepared(img)
    name = out["ready"]["served_model_name"]
    echo = {**os.environ, "TRTLLM_ENGINE_DOUBLE_ECHO": "1"}  # the generated ids are the prompt's
    with realfront.start(real_triton, out, KEY, env=echo, log_dir=tmp_path) as front:
        api = client(front)
        ask = {"model": name, "prompt": "The capital of France is Paris.", "max_tokens": 12, "stop": " of France"}
        whole = api.completions.create(**ask)
        chunks = [c.choices[0] for c in api.completions.create(**ask, stream=True) if c.choices]
    assert whole.choices[0].text == "".join(c.text for c in chunks) == "The capital", (whole, chunks)
    assert whole.choices[0].finish_reason == chunks[-1].finish_reason == "stop"
