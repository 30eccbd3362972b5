"""The llmapi workflow's answers through a whole worker in front of the FAKE tritonserver, asked by the official
`openai` client: the llmapi model streams the whole text so far, decoded by TensorRT-LLM's LLM API
(openai/detokenize.CumulativeText); what the front must add to make it the tokenizer's decoding of the ids."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from harness import tokenizers_fixture as fx
from harness.fake_triton import FakeTriton, Reply
from harness.image import templates_for
from trtllm_entrypoint.openai.detokenize import clean_up

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.process  # the official client asks the platform for its headers once (`uname -p`)


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def llmapi(kit, tmp_path: Path, shape: str = "llama3", **config):
    """The kit's worker serving upstream's llmapi model (its config.pbtxt) with a tokenizer of `shape`."""
    upstream = templates_for("triton_backend") / "llmapi" / "tensorrt_llm" / "config.pbtxt"
    path = tmp_path / "llmapi" / "tensorrt_llm" / "config.pbtxt"
    path.parent.mkdir(parents=True)
    path.write_text(re.sub(r"\$\{\w+\}", "1", upstream.read_text()))
    tokenizer = fx.write_tokenizer(tmp_path / f"tok-{shape}", shape, **config)
    plan = dataclasses.replace(kit.plan, workflow="llmapi", config=str(path), tokenizer=str(tokenizer))
    return dataclasses.replace(kit, plan=plan)


def test_llmapi_text_is_cleaned_up_as_a_whole_when_the_tokenizer_cleans_up(kit, tmp_path):
    """The LLM API applies clean_up_tokenization_spaces to each new piece of text, so " 's" or " n't" split across
    two pieces stays; the front cleans up the streamed text as a whole, as the tokenizer decodes all ids at once."""
    served = llmapi(
        kit, tmp_path, clean_up_tokenization_spaces=True,
        clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True,  # transformers 5 obeys it
    )  # fmt: skip
    tok = fx.byte_level("llama3")
    text = "It 's fine . They 're here , is n't it ? I 'm sure !"
    ids = tok.encode(text, add_special_tokens=False).ids
    pieces = [clean_up(tok.decode([i])) for i in ids]  # as the LLM API streams them: each piece cleaned alone
    assert "".join(pieces) != clean_up(text)  # the defect's shape: per-piece cleanup leaves some
    fake = FakeTriton(lambda body: Reply(pieces=pieces))

    async def calls(url):
        async with client(url) as api:
            whole = await api.completions.create(model="ensemble", prompt="p", max_tokens=len(ids))
            stream = await api.completions.create(model="ensemble", prompt="p", max_tokens=len(ids), stream=True)
            return whole, [c.choices[0].text async for c in stream if c.choices]

    whole, chunks = served.ask(fake, calls)
    assert whole.choices[0].text == "".join(chunks) == clean_up(text) == "It's fine. They're here, isn't it? I'm sure!"


def test_llmapi_stops_are_cut_by_the_front_on_the_text(kit, tmp_path):
    """The LLM API matches a stop string as its token ids and trims them from its text, but a stop of several tokens
    has its first ones streamed already, and one that other tokens spell never matches: the front cuts stops on the
    text itself (the model is not sent them) and leaves the stream, which ends generation."""
    served = llmapi(kit, tmp_path)
    fake = FakeTriton(lambda body: Reply(pieces=["The", " capital", " of", " France", " is", *[" x"] * 40]))

    async def calls(url):
        async with client(url) as api:
            whole = await api.completions.create(model="ensemble", prompt="p", max_tokens=50, stop=" of France")
            stream = await api.completions.create(
                model="ensemble", prompt="p", max_tokens=50, stop=[" of France", "zz"], stream=True
            )
            chunks = [chunk async for chunk in stream]
            spelled = await api.completions.create(model="ensemble", prompt="p", max_tokens=50, stop="tal of")
            return whole, chunks, spelled

    whole, chunks, spelled = served.ask(fake, calls)
    assert whole.choices[0].text == "The capital" and whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "The capital"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert spelled.choices[0].text == "The capi" and spelled.choices[0].finish_reason == "stop"
