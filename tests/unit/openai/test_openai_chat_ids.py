"""A chat prompt reaches the model with the special tokens its template wrote, once: the ids the front sends for a
chat are transformers' apply_chat_template(..., tokenize=True) (the template writes `{{ bos_token }}`, nothing is
added on top), and a model that tokenizes text itself (llmapi: the LLM API adds BOS) gets the text without the
template's leading BOS. `usage.prompt_tokens` counts what is sent.

The real templates are tests/data/chat_templates (SOURCES.md). Their models' own tokenizers are not available
offline (no Hub here), so none is skipped for that: where harness/tokenizers_fixture.py has a stand-in of the
family's shape (Llama 2 / Mistral / TinyLlama SentencePiece, Llama 3 and Qwen byte-level BPE, Gemma), the template is
paired with it; every other template gets a tiny tokenizer with its model's special tokens that, like Llama's,
Mistral's and Gemma's, adds BOS when asked to add special tokens (the case where a BOS can double)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import tokenizers
import transformers

from harness import tokenizers_fixture
from harness.fake_triton import FakeTriton, words
from harness.upstream_files import upstream_path
from tests.factories import ANSWER, SYSTEM, TEMPLATE_TOKENS, USER, WEATHER, chat_template_text
from trtllm_entrypoint.openai import chat, server
from trtllm_entrypoint.openai.protocol import ChatRequest

openai = pytest.importorskip("openai")

NAMES = sorted(TEMPLATE_TOKENS)
# Templates whose family has an offline stand-in tokenizer of its shape.
SHAPED = {
    "llama-2-7b-chat": "llama2",
    "tinyllama-1.1b-chat": "llama2",
    "mistral-7b-instruct": "llama2",
    "mistral-7b-instruct-v0.3": "llama2",
    "mixtral-8x7b-instruct": "llama2",
    "llama-3.1-8b-instruct": "llama3",
    "llama-3.2-3b-instruct": "llama3",
    "llama-3.3-70b-instruct": "llama3",
    "gemma-2-2b-it": "gemma",
    "gemma-3-1b-it": "gemma",
    "qwen2.5-7b-instruct": "qwen",
    "qwen3-0.6b": "qwen",
    "qwq-32b": "qwen",
}
CONVERSATIONS = [
    [USER],
    [SYSTEM, USER],
    [USER, ANSWER, {"role": "user", "content": "Où est Tōkyō? 東京 🗼"}],
]


def stand_in(directory: Path, name: str) -> Path:
    """A tokenizer directory for template `name`: its family's shape, or a tiny one with its model's special tokens
    (as real tokenizer.json files hold them: added, special) that adds BOS in front."""
    template = chat_template_text(name)
    if name in SHAPED:
        tokenizers_fixture.write_tokenizer(directory, SHAPED[name])
    else:
        tokens = TEMPLATE_TOKENS[name]
        vocab = {"<unk>": 0, **{token: i + 1 for i, token in enumerate(dict.fromkeys(tokens.values()))}}
        model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
        model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        model.add_special_tokens(list(dict.fromkeys(tokens.values())))
        data = json.loads(model.to_str())
        bos = tokens.get("bos_token")
        if bos:  # as JSON: TemplateProcessing's string form cannot hold a token with a colon (`<seed:bos>`)
            first = {"SpecialToken": {"id": bos, "type_id": 0}}
            a, b = {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}
            data["post_processor"] = {
                "type": "TemplateProcessing",
                "single": [first, a],
                "pair": [first, a, first, b],
                "special_tokens": {bos: {"id": bos, "ids": [vocab[bos]], "tokens": [bos]}},
            }
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens}
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    return directory


def front(directory: Path, base: Any, **plan: Any) -> server.Front:
    return server.build(dataclasses.replace(base, tokenizer=str(directory), max_seq_len=4096, **plan), "")


# Cohere's tool_use templates: no tool-call parser reads their format, so the front refuses requests with tools for
# them and sends no ids to compare (Cohere's default templates are compared).
COHERE_TOOLS = ("command-r-plus-tool_use", "command-r7b-12-2024-tool_use")


def tools(name: str) -> list[dict[str, Any]] | None:
    """A tool for the templates made for requests with tools (they render nothing without)."""
    return [WEATHER] if name.endswith("tool_use") else None


def request(messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None = None) -> ChatRequest:
    return msgspec.convert({"model": "ensemble", "messages": messages, "tools": offered}, ChatRequest)


def theirs(directory: Path, messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None = None) -> Any:
    """transformers' ids for the chat, or None where its template refuses the conversation. Its tokenizer runs
    tokenizer.json as it is, as the front's does and as transformers 4 runs every fast tokenizer (transformers 5
    rebuilds a Llama tokenizer's pipeline, which then writes no `▁` after a special token: a difference of the
    loader, not of the special tokens added here)."""
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(directory))
    try:
        ids = hf.apply_chat_template(
            messages, tools=offered, tokenize=True, add_generation_prompt=True, return_dict=False
        )
    except Exception:  # noqa: BLE001  (the template's own refusal: that conversation is not compared)
        return None
    return list(ids)


@pytest.mark.parametrize("name", [n for n in NAMES if n not in COHERE_TOOLS])
def test_the_ids_sent_for_a_chat_are_transformers_apply_chat_template_ids(name, kit, tmp_path):
    directory = stand_in(tmp_path / name, name)
    served = front(directory, kit.plan).served
    compared = 0
    for messages in CONVERSATIONS:
        expected = theirs(directory, messages, tools(name))
        if expected is None:
            continue
        work = chat.work(served, request(messages, tools(name)))
        (choice,) = work.choices
        assert choice.prompt_ids == expected, f"{name}: {messages}"
        assert work.prompt_tokens == len(expected)  # usage counts what is sent
        compared += 1
    assert compared, f"{name}: transformers rendered none of the conversations"


@pytest.mark.parametrize("name", ["llama-2-7b-chat", "llama-3.1-8b-instruct", "gemma-3-1b-it", "qwen3-0.6b"])
def test_llmapi_gets_text_that_its_tokenizer_adding_bos_makes_into_the_same_ids(name, kit, tmp_path):
    """The LLM API encodes the prompt text adding special tokens: the template's own BOS is dropped from the text
    when the tokenizer adds one, so the model sees one BOS, as transformers' ids have."""
    directory = stand_in(tmp_path / name, name)
    config = upstream_path("tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt")
    served = front(directory, kit.plan, workflow="llmapi", config=str(config)).served
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(directory))
    for messages in CONVERSATIONS:
        expected = theirs(directory, messages)
        if expected is None:
            continue
        work = chat.work(served, request(messages))
        (choice,) = work.choices
        assert hf.encode(choice.prompt, add_special_tokens=True) == expected, f"{name}: {messages}"
        assert work.prompt_tokens == len(expected)


@pytest.mark.process  # the official client asks `uname -p` once
def test_the_engine_receives_one_bos_for_a_llama_2_chat(kit):
    """Through the front and the official client: Llama 2's real template writes `<s>`; the fake tritonserver gets it
    once, and usage counts the ids it got."""
    directory = Path(kit.plan.tokenizer)
    (directory / "chat_template.jinja").write_text(chat_template_text("llama-2-7b-chat"))
    fake = FakeTriton(lambda body: words("Paris."))

    async def calls(url):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as api:
            return await api.chat.completions.create(model="ensemble", messages=[USER], max_tokens=8)

    answer = kit.ask(fake, calls)
    ids = fake.seen[0].body["input_ids"]
    bos = kit.tokenizer.token_to_id("<s>")
    assert ids[0] == bos and ids.count(bos) == 1, ids
    assert ids == theirs(directory, [USER])
    assert answer.usage.prompt_tokens == len(ids)
