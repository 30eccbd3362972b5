"""Real chat templates of each tool-call family (tests/data/chat_templates) against our parsers: the template's own
rendering of an assistant turn with tool calls (what the model was trained to write, rendered by transformers'
apply_chat_template) is read back by the family's parser, whole and streamed; the family comes from the template,
and the worker's start probe (the front's own renderer) finds that the template renders tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtllm_entrypoint.openai import structured, tools

pytest.importorskip("transformers")
# The real templates and the tokenizer directories the parity test makes of them (same layouts, same tokens).
from tests.factories import CHAT_TEMPLATES, WEATHER, chat_template_text  # noqa: E402
from tests.unit.openai.test_openai_chat_template_parity import hugging_face, ours, write_tokenizer  # noqa: E402

# The templates of each family this server reads calls of.
FAMILIES = {
    "hermes": ["qwen2.5-7b-instruct", "qwen3-0.6b", "qwq-32b", "hermes-3-llama-3.1-8b-tool_use", "granite-4.0"],
    "llama3_json": ["llama-3.1-8b-instruct", "llama-3.2-3b-instruct", "llama-3.3-70b-instruct"],
    "mistral": [
        "mistral-7b-instruct-v0.3",
        "mistral-nemo-instruct-2407",
        "mistral-small-3.2-24b-instruct-2506",
        "devstral-small-2507",
    ],  # fmt: skip
    "granite": ["granite-3.1-moe", "granite-3.2-8b-instruct", "granite-3.3-2b-instruct"],
    "qwen3_coder": ["qwen3-coder"],
}
# Templates whose calls no parser here reads: refused with TOOL_CALL_PARSER named, never misread.
UNREAD = ["glm-4.6", "gpt-oss-120b", "deepseek-v3.1", "kimi-k2-instruct", "minimax-m2"]
CALLS = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]


def tokenizer(tmp_path: Path, name: str) -> Path:
    return write_tokenizer(tmp_path / name, name, sorted(p.stem for p in CHAT_TEMPLATES.glob("*.jinja")).index(name))


def written_by_model(hf, calls) -> str | None:
    """The assistant turn as the template writes it: the conversation with the call, less the prompt before it
    (None for templates that leave calls out of the history, as Granite 3.x's do)."""
    user = {"role": "user", "content": "Weather in Paris and Tokyo?"}
    ids = ["Ab3dE6gH9", "Zx8wV7uT6"]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": ids[i], "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls)]}  # fmt: skip
    prompt = hf.apply_chat_template([user], tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    whole = hf.apply_chat_template([user, turn], tools=[WEATHER], tokenize=False)
    if "get_weather" not in whole.split(user["content"])[-1]:
        return None
    if not whole.startswith(prompt):  # QwQ opens the answer with a <think> block that the history leaves out
        prompt = prompt.removesuffix("<think>\n</think>").removesuffix("<think>\n")
    assert whole.startswith(prompt), "the template writes the call after its generation prompt"
    text = whole[len(prompt) :]
    for end in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<|end_of_text|>"):
        text = text.split(end)[0]
    return text


@pytest.mark.parametrize("family,name", [(f, n) for f, names in FAMILIES.items() for n in names])
def test_the_calls_a_real_template_writes_are_read_back_by_its_familys_parser(tmp_path, family, name):
    template = chat_template_text(name)
    assert tools.detect(template, None) == family
    directory = tokenizer(tmp_path, name)
    hf = hugging_face(directory)
    one = CALLS[:1] if family == "llama3_json" else CALLS  # Llama 3.1's template writes one call per turn
    text = written_by_model(hf, one)
    if text is None:  # the history has no calls: the format is only described (detect found its marker above)
        text = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Tokyo"}}]'  # noqa: E501
        assert family == "granite" and "<|tool_call|> followed by a JSON list" in template
    parsed = tools.parse(tools.FAMILIES[family], [WEATHER["function"]], text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == one, text
    # Only what the template writes besides the calls is content (Qwen3's empty reasoning block).
    assert (parsed.content or "").replace("<think>\n\n</think>", "").strip() == "", text
    streamed = tools.reader(tools.FAMILIES[family], [WEATHER["function"]])
    events = [e for piece in text for e in streamed.feed(piece)] + streamed.finish()
    assert [(c.name, json.loads(c.arguments)) for c in tools.assemble(events).calls] == one

    def renders(offered):  # the front's own renderer, as the worker probes it at start
        return ours(directory).render([{"role": "user", "content": "hi"}], tools=offered)

    assert structured.support(template, None, "auto", renders, "").family == tools.FAMILIES[family]


@pytest.mark.parametrize("name", UNREAD)
def test_templates_of_formats_no_parser_reads_refuse_tools_naming_the_variable(tmp_path, name):
    template = chat_template_text(name)
    found = structured.support(template, None, "auto", lambda offered: str(offered), "")
    assert found.family is None and structured.VARIABLE in found.no_family
