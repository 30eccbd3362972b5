"""Real models' chat templates through the whole path a user takes: `prepare` with FRONTEND=openai and the model's own
chat_template.jinja, the real tritonserver with upstream's models, our front, the official `openai` client. The
templates that used to crash the workers at start ({% generation %}) or answer 400 (strftime_now, loop controls) now
serve, and the prompt the front sends is transformers' rendering of the same messages (its token count, with the
model's tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

from harness import realfront, realtriton
from harness.image import Image, templates_for

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

KEY = "chat-template-admin-key-0123456789"
DATA = Path(__file__).parents[1] / "data" / "chat_templates"
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
    (img.model / "chat_template.jinja").write_text((DATA / f"{name}.jinja").read_text(encoding="utf-8"))
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
