"""A chat ends at the end of the model's turn: generation_config.json's `eos_token_id` (an int or a list: Llama 3
Instruct's [128001, 128008, 128009], Gemma's `<end_of_turn>`) ends a choice as the tokenizer's eos does. The engine
workflow's front stops the choice at any of these ids, shows nothing of that id, answers finish_reason "stop" and
closes the backend stream (which ends the generation in tritonserver). Through a whole worker in front of the FAKE
tritonserver, with a tokenizer in Gemma's shape (`<end_of_turn>` a special token of its own)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.fake_triton import FakeTriton, Reply
from harness.tiny_checkpoint import tiny_llama
from trtllm_entrypoint.openai import tokenizer

openai = pytest.importorskip("openai")

ANSWER = "The capital is Paris."
MESSAGES = [{"role": "user", "content": "Where?"}]


def gemma(directory: Path, eos_token_id: object) -> Path:
    """A tokenizer in Gemma's shape whose generation_config.json lists `eos_token_id`."""
    tiny_llama(directory, tokenizer="gemma")
    (directory / "chat_template.jinja").write_text(
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "<start_of_turn>model\n"
    )
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos_token_id}))
    return directory


@pytest.mark.parametrize(
    ("given", "expected"),
    [([2, 602], {2, 602}), (602, {2, 602}), (None, {2}), ("602", {2}), ([602, "x", None], {2, 602})],
)
def test_the_end_ids_are_the_tokenizers_eos_and_generation_configs(tmp_path, given, expected):
    assert tokenizer.load(gemma(tmp_path / "g", given)).end_ids == expected


def test_without_generation_config_the_tokenizers_eos_ends(tmp_path):
    directory = gemma(tmp_path / "g", 602)
    (directory / "generation_config.json").unlink()
    assert tokenizer.load(directory).end_ids == {2}


@pytest.mark.process  # the official client asks `uname -p` once
def test_a_chat_stops_at_the_end_of_turn_id_shows_nothing_of_it_and_ends_the_generation(kit, tmp_path):
    directory = gemma(tmp_path / "g", [2, 602])
    shaped = tokenizer.load(directory, skip_special_tokens=False)
    answer = shaped.encode_chat(ANSWER)
    after = shaped.encode_chat(" And then more.") * 40
    # step by step, then one step holding the end id with more after it (a step of several ids)
    steps = {
        "steps": Reply(ids=[[i] for i in [*answer, 602, *after]], delay_s=0.002),
        "one step": Reply(ids=[[*answer, 602, *after[:3]], *([i] for i in after)], delay_s=0.002),
    }
    fake = FakeTriton(lambda body: steps["one step" if body.get("runtime_top_k") == 2 else "steps"])

    async def calls(url):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as api:
            whole = await api.chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=200)
            await asyncio.wait_for(fake.client_closed.wait(), 10)
            stream = await api.chat.completions.create(
                model="ensemble", messages=MESSAGES, max_tokens=200, stream=True, extra_body={"top_k": 2}
            )
            fake.client_closed.clear()
            chunks = [chunk async for chunk in stream]
            await asyncio.wait_for(fake.client_closed.wait(), 10)
            return whole, chunks

    # special tokens shown, so only the front's cut keeps `<end_of_turn>` out of the text
    whole, chunks = kit.ask(fake, calls, tokenizer=str(directory), skip_special_tokens=False, max_seq_len=512)
    assert whole.choices[0].message.content == ANSWER and whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == len(answer) + 1  # the end id was generated: counted, not shown
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    total = len(answer) + 1 + len(after)
    for seen in fake.seen:  # the front left each stream at the end id: the generation ended there
        assert seen.closed_by_client and seen.sent < total
    assert fake.seen[0].body["end_id"] == 2  # the tokenizer's eos, as the preprocessing model sends it
