"""Tool-call parsing (entrypoints/trtllm_entrypoint/openai/tools.py) on model answers written as each family's
models write them: whole, streamed character by character and in model-sized pieces, and the stream's deltas put
together by the official `openai` client's own stream assembly (what `client.chat.completions.stream` uses)."""

from __future__ import annotations

import json
import random

import pytest

from trtllm_entrypoint import contract
from trtllm_entrypoint.openai import tools

openai = pytest.importorskip("openai")
from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402

FUNCTIONS = [
    {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },  # noqa: E501
    {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
]
PARIS = ("get_weather", {"city": "Paris", "days": 3})
CLOCK = ("get_time", {})

# (family, the model's text, the content expected, the calls expected)
ANSWERS = [
    # Qwen 2.5 / 3 and Hermes: text before a call stays content; several calls; any key order.
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.\n",
        [PARIS, CLOCK],
    ),  # fmt: skip
    (
        "hermes",
        '<tool_call>\n{"arguments": {"city": "Paris", "days": 3}, "name": "get_weather"}\n</tool_call>',
        None,
        [PARIS],
    ),  # fmt: skip
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"days\\": 3}"}\n</tool_call>',
        None,
        [PARIS],
    ),  # arguments as a JSON string  # fmt: skip
    ("hermes", "The answer is 4 <tool_ and <b>bold</b>", "The answer is 4 <tool_ and <b>bold</b>", []),
    ("hermes", "<tool_call>\nnot json\n</tool_call> after", "<tool_call>\nnot json\n</tool_call> after", []),
    (
        "hermes",
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # a tool the request does not offer
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        [],
    ),  # fmt: skip
    (
        "hermes",
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>\n<tool_call>{"name": "get_time", '
        '"arguments": {}}</tool_call>',
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>\n',
        [CLOCK],
    ),
    (
        "hermes",
        '<tool_call>\nnot json\n</tool_call>\n<tool_call>{"name": "get_time"}</tool_call>',
        "<tool_call>\nnot json\n</tool_call>\n",
        [CLOCK],
    ),  # no arguments at all: {}  # fmt: skip
    # Llama 3.1-3.3: bare JSON with `parameters`, `;` between calls, or after <|python_tag|>.
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', None, [PARIS]),
    (
        "llama3_json",
        '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris", '
        '"days": 3}}; {"name": "get_time", "parameters": {}}',
        None,
        [PARIS, CLOCK],
    ),  # fmt: skip
    ("llama3_json", '{"answer": 42, "unit": "m"}', '{"answer": 42, "unit": "m"}', []),  # JSON that is no call
    ("llama3_json", 'Paris is {"name": "get_time"}', 'Paris is {"name": "get_time"}', []),  # only at the start
    # Mistral: the JSON list after [TOOL_CALLS] (tokenizers v3-v7), the name form (v11+), and both with the special
    # tokens stripped by a detokenizer that skips them.
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "get_time", "arguments": {}}]',
        None,
        [PARIS, CLOCK],
    ),  # fmt: skip
    ("mistral", '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]', None, [PARIS]),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]{}',
        None,
        [PARIS, CLOCK],
    ),  # fmt: skip
    ("mistral", 'get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris", "days": 3}', None, [PARIS]),
    ("mistral", 'get_weather{"city": "Paris", "days": 3}', None, [PARIS]),
    ("mistral", "[1] Paris, then get_weather is a name", "[1] Paris, then get_weather is a name", []),
    ("mistral", "getting there", "getting there", []),
    # Qwen3-Coder: XML parameters, typed by the tool's schema
    (
        "qwen3_coder",
        "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
        "</function>\n</tool_call>",
        "I will check.\n",
        [PARIS, CLOCK],
    ),  # fmt: skip
    (
        "qwen3_coder",
        "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",
        "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>",
        [],
    ),  # fmt: skip
    # Granite 3.x
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]', None, [PARIS]),
]


def calls_of(parsed: tools.Parsed) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in parsed.calls]


def streamed(family: str, text: str, size: int) -> list[tools.Event]:
    parser = tools.reader(tools.FAMILIES[family], FUNCTIONS)
    events = []
    for i in range(0, len(text), size):
        events += parser.feed(text[i : i + size])
    return events + parser.finish()


@pytest.mark.parametrize("family,text,content,calls", ANSWERS)
def test_whole_and_streamed_answers_give_the_same_calls_and_content(family, text, content, calls):
    whole = tools.parse(tools.FAMILIES[family], FUNCTIONS, text)
    assert whole.content == content
    assert calls_of(whole) == calls
    for size in (1, 3, 7, len(text)):  # a character at a time, and model-token-sized pieces
        again = tools.assemble(streamed(family, text, size))
        assert (again.content, calls_of(again)) == (content, calls), size


@pytest.mark.parametrize("family,text,content,calls", [a for a in ANSWERS if a[3]])
def test_the_official_client_assembles_the_streamed_deltas_into_tool_calls(family, text, content, calls):
    """Chunks shaped as the front sends them, fed to the client's own stream state: it must end with the calls."""
    state = ChatCompletionStreamState()
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(chunk({"role": "assistant"})))
    for event in streamed(family, text, 2):
        delta = {"content": event.text} if isinstance(event, tools.Text) else {"tool_calls": [tools.delta(event)]}
        state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(chunk(delta)))
    state.handle_chunk(openai.types.chat.ChatCompletionChunk.model_validate(chunk({}, "tool_calls")))
    message = state.get_final_completion().choices[0].message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    assert got == calls
    assert (message.content or None) == content
    assert all(c.type == "function" and c.id for c in message.tool_calls)
    # Arguments come in fragments as the model writes them (held only until the name is known, and whole where
    # the model wrote them as one JSON string).
    fragments = [e for e in streamed(family, text, 2) if isinstance(e, tools.CallArguments) and e.index == 0]
    assert len(fragments) > 1 or not calls[0][1] or '{"arguments"' in text or '"arguments": "' in text


def test_mistral_call_ids_are_the_nine_letters_and_digits_its_templates_demand():
    parsed = tools.parse(tools.FAMILIES["mistral"], FUNCTIONS, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]')
    assert len(parsed.calls[0].id) == 9 and parsed.calls[0].id.isalnum()
    hermes = tools.parse(
        tools.FAMILIES["hermes"], FUNCTIONS, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert hermes.calls[0].id.startswith("call_")


def test_an_answer_cut_short_keeps_the_call_it_started():
    """max_tokens cut the arguments: the call and what came of its arguments stay (finish_reason says length)."""
    parsed = tools.parse(tools.FAMILIES["hermes"], FUNCTIONS, '<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert [c.name for c in parsed.calls] == ["get_weather"] and parsed.calls[0].arguments == '{"ci'
    held = tools.parse(tools.FAMILIES["hermes"], FUNCTIONS, "<tool_call>\n{")  # no name yet: it was text after all
    assert held.content == "<tool_call>\n{" and not held.calls


@pytest.mark.parametrize(
    "template,model_type,family",
    [
        ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>", None, "hermes"),
        ("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}", None, "mistral"),
        ("<|start_header_id|>ipython<|end_header_id|><|python_tag|>", "llama", "llama3_json"),
        ("<|start_header_id|>{% if tools %}parameters{% endif %}", "llama", "llama3_json"),
        ("<|tool_call|>", "granite", "granite"),
        ("<tool_call>\n<function=get_weather>", "qwen3_moe", "qwen3_coder"),  # Qwen3-Coder's XML form
        ("<|channel|>analysis", "gpt_oss", None),
        ("{{ '<tool_call>' + tc.name }}<arg_key>", "glm4_moe", None),  # GLM 4.5/4.6
        ("{{ messages }}", "qwen2", "hermes"),  # nothing in the template: config.json's model_type
        ("{{ messages }}", "gpt2", None),
        (None, None, None),
    ],
)
def test_the_family_comes_from_the_template_else_the_model_type(template, model_type, family):
    assert tools.detect(template, model_type) == family


def test_a_guided_required_choice_reads_the_list_of_calls_the_guide_makes_any_model_write():
    text = (
        '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, {"name": "get_time", "parameters": {}}]'
    )
    for size in (1, 5, len(text)):
        parser = tools.reader(tools.REQUIRED, FUNCTIONS)
        events = [e for i in range(0, len(text), size) for e in parser.feed(text[i : i + size])] + parser.finish()
        parsed = tools.assemble(events)
        assert (parsed.content, calls_of(parsed)) == (None, [PARIS, CLOCK])


def test_a_guided_named_choice_is_that_call_with_the_answer_as_its_arguments():
    parser = tools.NamedCall(tools.FAMILIES["hermes"], "get_weather")
    events = parser.feed('{"city": ') + parser.feed('"Paris", "days": 3}') + parser.finish()
    assert isinstance(events[0], tools.CallStart) and events[0].name == "get_weather"
    assert calls_of(tools.assemble(events)) == [PARIS]
    assert calls_of(tools.assemble(tools.NamedCall(None, "get_time").finish())) == [CLOCK]


def test_the_variables_values_are_the_families_the_front_reads():
    assert (tools.AUTO, *tools.FAMILIES) == contract.TOOL_CALL_PARSERS


@pytest.mark.parametrize("family,text,content,calls", ANSWERS)
def test_any_split_of_the_stream_reads_the_same(family, text, content, calls):
    """Tokens split text anywhere (inside markers, keys, escapes): 50 random splits each read the same."""
    rng = random.Random(text)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
        parser = tools.reader(tools.FAMILIES[family], FUNCTIONS)
        events = []
        for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
            events += parser.feed(text[start:end])
        again = tools.assemble(events + parser.finish())
        assert (again.content, calls_of(again)) == (content, calls), cuts


@pytest.mark.parametrize(
    "text",
    ["<tool_call>" + "[" * 5000, "<tool_call>{\"name\": \"" + "\\\\" * 3000, "[TOOL_CALLS]" + "{" * 4000 + "}" * 3999,
     "\x00<tool_call>\ud800{}</tool_call>", "<tool_call>" * 2000, '{"name": "get_time", "arguments": {}}' * 500],
)  # fmt: skip
def test_hostile_answers_end_as_text_or_calls_without_error(text):
    for family in tools.FAMILIES.values():
        parsed = tools.parse(family, FUNCTIONS, text)
        assert isinstance(parsed.content, str) or parsed.calls
