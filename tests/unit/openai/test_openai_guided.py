"""response_format and tool_choice as the backend's guided decoding inputs (openai/guided.py): each form's guide,
and the 400 (GuideError naming the field) for what the grammar compiler could not take."""

from __future__ import annotations

import json

import pytest

from trtllm_entrypoint.openai import guided
from trtllm_entrypoint.openai.guided import Guide, GuideError

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "$defs": {"unit": {"enum": ["C", "F"]}},
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize(
    "response_format,expected",
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, Guide("json")),
        (
            {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}},
            Guide("json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ),  # fmt: skip
        ({"type": "json", "schema": SCHEMA}, Guide("json_schema", json.dumps(SCHEMA, separators=(",", ":")))),
        ({"type": "regex", "regex": r"\d{3}-\d{4}"}, Guide("regex", r"\d{3}-\d{4}")),
        ({"type": "ebnf", "ebnf": 'root ::= "yes" | "no"'}, Guide("ebnf_grammar", 'root ::= "yes" | "no"')),
    ],
)
def test_each_response_format_maps_to_the_backends_guide(response_format, expected):
    assert guided.from_response_format(response_format) == expected


def test_the_guide_goes_into_the_two_declared_inputs_and_a_json_guide_needs_no_text():
    assert Guide("json").inputs() == {"guided_decoding_guide_type": "json"}
    assert Guide("regex", "a+").inputs() == {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "a+"}


@pytest.mark.parametrize(
    "response_format,words",
    [
        ({"type": "xml"}, "allowed: text, json_object"),
        ({"type": "json_schema"}, "json_schema: {name, schema}"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}}, "not a JSON Schema"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "map"}}}, "schema.type must be one of"),
        ({"type": "json_schema", "json_schema": {"schema": {"$ref": "https://evil.example/s.json"}}}, "$ref"),
        ({"type": "json_schema", "json_schema": {"schema": {"properties": {"a": {"pattern": "("}}}}}, "invalid"),
        ({"type": "json_schema", "json_schema": {"schema": {"properties": {"a": {"minLength": -1}}}}}, "minLength"),
        ({"type": "json_schema", "json_schema": {"schema": {"anyOf": []}}}, "anyOf must be a non-empty list"),
        ({"type": "json_schema", "json_schema": {"schema": {"required": "city"}}}, "required must be a list"),
        ({"type": "regex", "regex": "[a-"}, "invalid"),
        ({"type": "regex"}, "needs `regex`"),
        ({"type": "ebnf", "ebnf": 'start ::= "x"'}, "root ::="),
    ],
)
def test_a_guide_the_backend_cannot_take_is_refused_naming_response_format(response_format, words):
    with pytest.raises(GuideError) as refused:
        guided.from_response_format(response_format)
    assert refused.value.param == "response_format" and words in refused.value.message


def test_a_schema_nested_without_end_is_refused_before_the_compiler_sees_it():
    schema: dict = {"type": "object"}
    for _ in range(guided.MAX_DEPTH + 2):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(GuideError, match="deeper"):
        guided.from_response_format({"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}})


def test_a_named_tool_choice_guides_with_that_tools_parameters():
    guide = guided.for_tool_choice([WEATHER, CLOCK], {"type": "function", "function": {"name": "get_weather"}})
    assert guide is not None and guide.type == "json_schema" and json.loads(guide.guide or "") == SCHEMA
    assert guide.param == "tool_choice"
    assert guided.for_tool_choice([WEATHER, CLOCK], {"type": "function", "function": {"name": "get_time"}}) == Guide(
        "json_schema", '{"type":"object"}', "tool_choice"
    )


def test_required_guides_with_a_list_of_calls_of_the_offered_tools():
    jsonschema = pytest.importorskip("jsonschema")
    guide = guided.for_tool_choice([WEATHER, CLOCK], "required")
    assert guide is not None
    schema = json.loads(guide.guide or "")
    jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Paris"}}], schema)
    jsonschema.validate([{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "X"}}],
                        schema)  # fmt: skip
    for wrong in ([], [{"name": "rm_rf", "parameters": {}}], [{"name": "get_weather", "parameters": {"days": 2}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_auto_and_none_need_no_guide(choice):
    assert guided.for_tool_choice([WEATHER], choice) is None


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
        ([{"type": "function", "function": {"parameters": {}}}], "auto", "tools"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "blob"}}}], "required", "tools"),
    ],
)
def test_bad_tools_or_choices_are_refused_naming_the_field(tools, choice, param):
    with pytest.raises(GuideError) as refused:
        guided.for_tool_choice(tools, choice)
    assert refused.value.param == param
