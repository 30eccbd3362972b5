"""One chat request's structure (openai/structured.py): what the template, the backend and the answer's reader get
for each tools / tool_choice / response_format combination, and the 400s where the served model cannot do it."""

from __future__ import annotations

import json

import pytest

from trtllm_entrypoint.openai import structured, tools
from trtllm_entrypoint.openai.guided import GuideError

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}  # noqa: E501
CLOCK = {"type": "function", "function": {"name": "get_time"}}
GUIDED = structured.Support(tools.FAMILIES["hermes"])
UNGUIDED = structured.Support(
    tools.FAMILIES["hermes"], guided_off="tag 25.01 has none; the first tag that serves it is 25.05"
)  # noqa: E501
NO_PARSER = structured.Support(None, "the model's chat template renders no tools (TOOL_CALL_PARSER=auto)")
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}


def read(structure: structured.Structure, text: str) -> tools.Parsed:
    assert structure.reader is not None
    parser = structure.reader()
    return tools.assemble([*parser.feed(text), *parser.finish()])


def test_auto_renders_the_tools_and_reads_calls_with_the_family_parser_and_no_guide():
    plan = structured.plan(GUIDED, [WEATHER, CLOCK], None, None)
    assert plan.tools == [WEATHER, CLOCK] and plan.guide is None
    parsed = read(plan, 'Sure.<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert parsed.content == "Sure." and [c.name for c in parsed.calls] == ["get_time"]


def test_none_renders_the_tools_but_reads_text():
    plan = structured.plan(NO_PARSER, [WEATHER], "none", None)
    assert plan.tools == [WEATHER] and plan.reader is None and plan.guide is None


def test_required_and_named_are_guided_where_the_backend_takes_a_guide():
    required = structured.plan(GUIDED, [WEATHER, CLOCK], "required", None)
    assert required.guide is not None and required.guide.type == "json_schema"
    parsed = read(required, '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Oslo"})]
    named = structured.plan(
        NO_PARSER, [WEATHER, CLOCK], {"type": "function", "function": {"name": "get_weather"}}, None
    )
    assert named.guide is not None and json.loads(named.guide.guide or "") == WEATHER["function"]["parameters"]
    assert [c.name for c in read(named, '{"city": "Oslo"}').calls] == ["get_weather"]


def test_without_guided_decoding_required_and_named_are_best_effort_with_the_family_parser():
    named = structured.plan(UNGUIDED, [WEATHER, CLOCK], {"type": "function", "function": {"name": "get_time"}}, None)
    assert named.guide is None
    both = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>'  # noqa: E501
    assert [c.name for c in read(named, both).calls] == ["get_time"]  # only the named tool is read as a call
    with pytest.raises(GuideError) as refused:
        structured.plan(structured.Support(None, "no parser", "no guide"), [WEATHER], "required", None)
    assert refused.value.param == "tools"


def test_response_format_is_guided_or_refused_naming_it_and_the_way_out():
    assert structured.plan(GUIDED, None, None, SCHEMA_FORMAT).guide.type == "json_schema"  # type: ignore[union-attr]
    assert structured.plan(UNGUIDED, None, None, {"type": "text"}).guide is None
    for support, offered in ((UNGUIDED, None), (UNGUIDED, [WEATHER])):
        with pytest.raises(GuideError) as refused:
            structured.plan(support, offered, None, SCHEMA_FORMAT)
        assert refused.value.param == "response_format" and "25.05" in refused.value.message


@pytest.mark.parametrize(
    "support,offered,choice,response_format,param",
    [
        (NO_PARSER, [WEATHER], None, None, "tools"),  # no parser: tools refused, naming the variable
        (GUIDED, None, "auto", None, "tool_choice"),  # a choice without tools
        (GUIDED, [WEATHER], "required", SCHEMA_FORMAT, "response_format"),  # two guides for one answer
        (GUIDED, [WEATHER], {"type": "function", "function": {"name": "nope"}}, None, "tool_choice"),
        (GUIDED, [{"type": "function"}], None, None, "tools"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(support, offered, choice, response_format, param):
    with pytest.raises(GuideError) as refused:
        structured.plan(support, offered, choice, response_format)
    assert refused.value.param == param
    if param == "tools" and support is NO_PARSER:
        assert structured.VARIABLE in refused.value.message


def test_parallel_tool_calls_false_is_carried_to_the_answer():
    assert structured.plan(GUIDED, [WEATHER], None, None, parallel_tool_calls=False).parallel is False


def test_support_takes_the_variable_over_the_template_and_needs_a_template_that_renders_tools():
    def renders(offered):
        return "tools: " + ",".join(t["function"]["name"] for t in offered)

    assert structured.support("<tool_call>", None, "auto", renders, "").family == tools.FAMILIES["hermes"]
    assert structured.support("<tool_call>", None, "mistral", renders, "").family == tools.FAMILIES["mistral"]
    ignored = structured.support("<tool_call>", None, "auto", lambda offered: "no tools here", "")
    assert ignored.family is None and "renders no tools" in ignored.no_family
    unknown = structured.support("{{ messages }}", "gpt2", "auto", renders, "")
    assert unknown.family is None and structured.VARIABLE in unknown.no_family


def test_a_reader_gives_openai_deltas_and_the_whole_message_with_finish_reason_tool_calls():
    text = 'Sure.<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'  # noqa: E501
    plan = structured.plan(GUIDED, [WEATHER, CLOCK], None, None)
    streamed = structured.Reader.of(plan, whole=False)
    assert streamed is not None
    deltas = [d for piece in text for d in streamed.feed(piece)] + streamed.finish()
    assert "".join(d.get("content", "") for d in deltas) == "Sure."
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "id" in d.get("tool_calls", [{}])[0]] == [
        "get_time",
        "get_weather",
    ]  # noqa: E501
    assert streamed.finish_reason("stop") == "tool_calls" and streamed.finish_reason("length") == "length"
    whole = structured.Reader.of(structured.plan(GUIDED, [WEATHER, CLOCK], None, None, parallel_tool_calls=False), True)
    assert whole is not None
    whole.feed(text)
    whole.finish()
    message = whole.message()
    assert message["content"] == "Sure." and [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"]
    assert structured.Reader.of(structured.plan(GUIDED, None, None, None), True) is None  # plain text: no reader
