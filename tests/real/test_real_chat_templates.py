"""Real models' chat templates through the whole path a user takes: `prepare` with FRONTEND=openai and the model's own
chat_template.jinja, the real tritonserver with upstream's models, our front, the official `openai` client. The
templates that used to crash the workers at start ({% generation %}) or answer 400 (strftime_now, loop controls) now
serve, and the prompt the front sends is transformers' rendering of the same messages (its token count, with the
model's tokenizer)."""

from __future__ import annotations

import json
import os

import pytest
import tokenizers

from harness import realfront, realtriton
from harness.image import Image, templates_for
from tests.factories import chat_template_text

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

KEY = "chat-template-admin-key-0123456789"
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is TensorRT-LLM? Où ça ? 東京 🗼"},
    {"role": "assistant", "content": "A library."},
    {"role": "user", "content": "What is TensorRT-LLM?"},
]


# {% generation %} stopped the workers at start; strftime_now answered every chat with 400.
@pytest.mark.parametrize("name", ["phi-4-reasoning", "gpt-oss-120b"])
def test_a_real_template_serves_through_the_official_client_as_transformers_renders_it(tmp_path, real_triton, name):
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    (img.model / "chat_template.jinja").write_text(chat_template_text(name))
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT")}
    result = img.run("prepare", FRONTEND="openai", TRITON_ADMIN_KEY=KEY, **ports)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    served = out["ready"]["served_model_name"]
    with realfront.start(real_triton, out, KEY, log_dir=tmp_path) as front:
        api = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=60)
        chat = api.chat.completions.create(model=served, messages=MESSAGES, max_tokens=4)
        streamed = list(api.chat.completions.create(model=served, messages=MESSAGES, max_tokens=4, stream=True))
        assert front.stop() == 0, front.log()[-3000:]
    theirs = transformers.AutoTokenizer.from_pretrained(str(img.model)).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    tokenizer = tokenizers.Tokenizer.from_file(str(img.model / "tokenizer.json"))
    counted = len(tokenizer.encode(theirs, add_special_tokens=False).ids)  # the template wrote its special tokens
    assert chat.usage.prompt_tokens == counted
    # The engine double answers with the prompt's last tokens, mostly the template's markup (unknown to the tiny
    # vocabulary): the answer's length is what can be checked here.
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 4
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"


# A SentencePiece model and a byte-level one, each with its family's real template.
@pytest.mark.parametrize("name,shape", [("llama-2-7b-chat", "llama2"), ("qwen2.5-7b-instruct", "qwen")])
def test_a_chat_is_sent_as_transformers_tokenizes_it_and_answered_in_the_models_exact_text(
    tmp_path, real_triton, name, shape
):
    """A user's start (FRONTEND=openai only) of a model with its family's tokenizer and real chat template, asked by
    the official client: the ids the tensorrt_llm model gets are transformers' apply_chat_template(tokenize=True)
    ids (one BOS), and the answer, whole and streamed, is the tokenizer's decoding of the generated ids. The engine
    double echoes the prompt's ids (TRTLLM_ENGINE_DOUBLE_ECHO), so the answer is the chat's own text up to the
    model's end of turn, accents, CJK and emoji included."""
    img = Image(tmp_path, "25.01", templates_for("v0.17.0"), tokenizer=shape)
    (img.model / "chat_template.jinja").write_text(chat_template_text(name))
    ports = {port: str(realtriton.free_port()) for port in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT")}
    result = img.run("prepare", FRONTEND="openai", TRITON_ADMIN_KEY=KEY, **ports)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    out["argv"].append(realtriton.private_backends(real_triton, tmp_path))  # this checkout's engine double (echo)
    served = out["ready"]["served_model_name"]
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(img.model)).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    max_tokens = 24
    echo = {**os.environ, "TRTLLM_ENGINE_DOUBLE_ECHO": "1"}
    with realfront.start(real_triton, out, KEY, env=echo, log_dir=tmp_path) as front:
        api = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=60)
        chat = api.chat.completions.create(model=served, messages=MESSAGES, max_tokens=max_tokens)
        chunks = api.chat.completions.create(model=served, messages=MESSAGES, max_tokens=max_tokens, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert front.stop() == 0, front.log()[-3000:]
    tokenizer = tokenizers.Tokenizer.from_file(str(img.model / "tokenizer.json"))
    generated = [theirs[i % len(theirs)] for i in range(max_tokens)]
    # The model's turn ends at its eos (ChatML's <|im_end|> ends the echoed system turn): nothing after it is shown.
    eos = tokenizer.token_to_id(json.loads((img.model / "tokenizer_config.json").read_text())["eos_token"])
    ended = eos in generated
    if ended:
        generated = generated[: generated.index(eos)]
    assert chat.usage.prompt_tokens == len(theirs)
    assert chat.choices[0].finish_reason == ("stop" if ended else "length")
    assert chat.choices[0].message.content == streamed == tokenizer.decode(generated, skip_special_tokens=True)
