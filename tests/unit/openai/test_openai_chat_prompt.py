"""The prompt the front sends tritonserver for a chat is, byte for byte, transformers' rendering of the same messages
with the model's real template: asked through the official `openai` client, the worker built from its plan, the
fake tritonserver recording what it got (harness/fake_triton.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.fake_triton import FakeTriton, words

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

# The official client asks the platform for its headers once (`uname -p`): a program, so this layer.
pytestmark = pytest.mark.process

DATA = Path(__file__).parents[2] / "data" / "chat_templates"
MESSAGES = [
    {"role": "system", "content": "Réponds en français."},
    {"role": "user", "content": "Où est la tour Eiffel ? 東京タワーは? 🗼"},
    {"role": "assistant", "content": "À Paris."},
    {"role": "user", "content": "Merci !"},
]


@pytest.mark.parametrize(
    "name",
    # the date (Llama 3.2, gpt-oss), {% generation %} (Phi-4-reasoning), loop controls (Command R7B), plain ChatML
    ["llama-3.2-3b-instruct", "gpt-oss-120b", "phi-4-reasoning", "command-r7b-12-2024", "qwen2.5-7b-instruct"],
)
def test_the_prompt_sent_is_transformers_rendering(kit, name):
    tokenizer = Path(kit.plan.tokenizer)
    (tokenizer / "chat_template.jinja").write_text((DATA / f"{name}.jinja").read_text(encoding="utf-8"))
    fake = FakeTriton(lambda body: words("ok"))

    async def calls(url):
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
        async with api:
            return await api.chat.completions.create(model=kit.plan.served_name, messages=MESSAGES, max_tokens=5)

    answer = kit.ask(fake, calls, max_seq_len=4096)  # real templates make prompts longer than the kit's context
    expected = transformers.AutoTokenizer.from_pretrained(str(tokenizer)).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert answer.choices[0].message.content == "ok"
    # The engine workflow's front sends the rendered prompt as the ids the model's tokenizer makes of it (the
    # template's special tokens, none added on top).
    assert fake.seen[0].body["input_ids"] == kit.chat_ids(expected)
