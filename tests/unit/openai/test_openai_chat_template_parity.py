"""Real models' chat templates (tests/data/chat_templates, SOURCES.md says where each came from), rendered by the
front's environment and by transformers' own apply_chat_template for the same tokenizer directory, must give the
same prompt, or fail alike. Offline: each tokenizer is a tiny tokenizer.json beside the real template and tokens."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache, partial
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import transformers

from tests.factories import ANSWER, SYSTEM, TEMPLATE_TOKENS, USER, WEATHER, chat_template_text
from trtllm_entrypoint.openai import chat_template as ct

NAMES = sorted(TEMPLATE_TOKENS)

# Command R+'s tool_use template reads Cohere's own tool shape, not OpenAI's.
COHERE_WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameter_definitions": {"city": {"description": "The city, e.g. Paris", "type": "str", "required": True}},
}
TOOLS = {"command-r-plus-tool_use": [COHERE_WEATHER]}
CALL = {"id": "Ab3dE6gH9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "system+user": [SYSTEM, USER],
    "user": [USER],
    "multi-turn": [SYSTEM, USER, ANSWER, {"role": "user", "content": "And of Japan?"}],
    "non-ascii": [
        {"role": "user", "content": "Où est la tour Eiffel ? «Ça va» — 東京タワーはどこ? 🗼"},
        {"role": "assistant", "content": "À Paris. 🇫🇷 東京タワーは東京にあります。"},
        {"role": "user", "content": "Merci ! 謝謝 ünïcødé\n\ttabs"},
    ],
    "reasoning": [
        USER,
        {**ANSWER, "reasoning_content": "France's capital is Paris."},
        {"role": "user", "content": "Sure?"},
    ],
    "tool round": [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "Ab3dE6gH9", "name": "get_weather", "content": '{"temperature": 21}'},
    ],
    # transformers' documented shape: the arguments as an object (OpenAI sends a JSON string; many templates need this)
    "tool round, object arguments": [
        USER,
        {
            "role": "assistant",
            "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "tool_call_id": "Ab3dE6gH9", "name": "get_weather", "content": '{"temperature": 21}'},
        ANSWER,
    ],
}


def write_tokenizer(directory: Path, name: str, index: int) -> Path:
    """A tokenizer directory laid out as on the Hub: the template in chat_template.jinja or tokenizer_config.json,
    the special tokens in tokenizer_config.json or only in special_tokens_map.json (alternating, so both layouts
    are compared)."""
    tokens = TEMPLATE_TOKENS[name]
    vocab = {"<unk>": 0, **{token: i + 1 for i, token in enumerate(dict.fromkeys(tokens.values()))}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    model.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    template = chat_template_text(name)
    if index % 2:
        config["chat_template"] = template
    else:
        (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    if index % 4 < 2:
        config.update(tokens)
    else:
        (directory / "special_tokens_map.json").write_text(json.dumps(tokens))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@cache
def tokenizer_dir(name: str, root: str) -> Path:
    return write_tokenizer(Path(root) / name, name, NAMES.index(name))


@cache
def hugging_face(path: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(path))


@cache
def ours(path: Path) -> ct.ChatTemplate:
    return ct.ChatTemplate(ct.discover(path))


def outcome(render) -> tuple[str, str]:
    try:
        return "prompt", render()
    except Exception as exc:  # noqa: BLE001  (the outcome of either renderer, compared below)
        return "error", str(exc)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("tokenizers"))


@pytest.mark.parametrize("name", NAMES)
def test_each_real_template_compiles_and_renders_a_question(name, root):
    found = ct.discover(tokenizer_dir(name, root))
    assert found.templates[ct.DEFAULT] == chat_template_text(name)
    tools = TOOLS.get(name, [WEATHER]) if name.endswith("tool_use") else None  # the template for tools
    prompt = ours(tokenizer_dir(name, root)).render([USER], tools=tools, add_generation_prompt=True)
    assert USER["content"] in prompt


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_the_front_renders_as_transformers(name, conversation, root):
    path = tokenizer_dir(name, root)
    messages = CONVERSATIONS[conversation]
    template_text = chat_template_text(name)
    tool_sets = [None, TOOLS.get(name, [WEATHER])] if "tools" in template_text else [None]
    compared = 0
    for tools in tool_sets:
        for add_generation_prompt in (True, False):
            asked = {"tools": tools, "add_generation_prompt": add_generation_prompt}
            theirs = outcome(partial(hugging_face(path).apply_chat_template, messages, tokenize=False, **asked))
            mine = outcome(partial(ours(path).render, messages, **asked))
            where = f"{name}, {conversation}, tools={tools is not None}, add_generation_prompt={add_generation_prompt}"
            assert mine[0] == theirs[0], f"{where}: transformers {theirs}, the front {mine}"
            if mine[0] == "prompt":
                assert mine[1] == theirs[1], where
                compared += 1
            else:  # the same refusal, in our one error type
                assert theirs[1] in mine[1], where
    if conversation == "user":  # every template renders a lone question one way or the other
        assert compared


def test_templates_that_read_the_date_render_today():
    """Llama 3.2 fell back to its hard-coded 26 Jul 2024; gpt-oss, Granite and Mistral Small 3.2 could not render."""
    today = {
        "llama-3.2-3b-instruct": "%d %b %Y",
        "granite-3.3-2b-instruct": "%B %d, %Y",
        "gpt-oss-120b": "%Y-%m-%d",
        "mistral-small-3.2-24b-instruct-2506": "%Y-%m-%d",
    }
    for name, form in today.items():
        template = ct.ChatTemplate(ct.Found({ct.DEFAULT: chat_template_text(name)}, name, TEMPLATE_TOKENS[name]))
        prompt = template.render([USER])
        assert datetime.now().strftime(form) in prompt, name
        assert "26 Jul 2024" not in prompt, name
