"""Guided decoding for the OpenAI API: `response_format` and a required or named `tool_choice` turned into the guide
the backend's models take (inputs `guided_decoding_guide_type` and `guided_decoding_guide`, from tensorrtllm_backend
v0.19.0 / NGC 25.05), checked first so that a guide the backend cannot take is a 400, never a failed generation.

    response_format                                            guide type      guide
    {"type": "text"}                                           (none)
    {"type": "json_object"}                                    json            (none: any JSON)
    {"type": "json_schema", "json_schema": {"schema": {…}}}    json_schema     the schema
    {"type": "json", "schema": {…}}                 extension  json_schema     the schema (trtllm-serve's form)
    {"type": "regex", "regex": "…"}                 extension  regex           the expression
    {"type": "ebnf", "ebnf": "root ::= …"}          extension  ebnf_grammar    the grammar (xgrammar's EBNF)
    tool_choice "required"                                     json_schema     a list of calls of the offered tools
    tool_choice {"type": "function", "function": {"name"}}     json_schema     that tool's parameters

Pure: the front decides whether the served model takes a guide at all (GUIDE_INPUTS among its declared inputs, and
the entrypoint's word that the backend was configured for it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GUIDE_TYPE_INPUT = "guided_decoding_guide_type"
GUIDE_INPUT = "guided_decoding_guide"
GUIDE_INPUTS = frozenset({GUIDE_TYPE_INPUT, GUIDE_INPUT})
MAX_DEPTH = 32  # nesting of a schema: deeper ones are refused before they reach the grammar compiler
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalProperties", "contains", "propertyNames", "additionalItems", "unevaluatedProperties")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


class GuideError(ValueError):
    """A request's guide the backend cannot take: the front answers 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Guide:
    type: str  # json | json_schema | regex | ebnf_grammar (the backend's names)
    guide: str | None = None
    param: str = "response_format"  # what the request asked it with

    def inputs(self) -> dict[str, object]:
        """The entry model's inputs for this guide."""
        body: dict[str, object] = {GUIDE_TYPE_INPUT: self.type}
        if self.guide is not None:
            body[GUIDE_INPUT] = self.guide
        return body


def from_response_format(response_format: Mapping[str, Any] | None) -> Guide | None:
    """The guide a response_format asks for (None for text), or GuideError."""
    if not response_format:
        return None
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise GuideError("response_format json_schema needs `json_schema: {name, schema}`", "response_format")
        return schema_guide(spec["schema"], "response_format")
    if kind == "json":
        return schema_guide(response_format.get("schema"), "response_format")
    if kind == "regex":
        return Guide("regex", _regex(response_format.get("regex")))
    if kind == "ebnf":
        return Guide("ebnf_grammar", _grammar(response_format.get("ebnf")))
    raise GuideError(
        f"response_format type {kind!r} is not supported; allowed: text, json_object, json_schema, "
        "and the extensions json (with `schema`), regex (with `regex`), ebnf (with `ebnf`)",
        "response_format",
    )


def schema_guide(schema: object, param: str) -> Guide:
    check_schema(schema, param)
    return Guide("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False), param)


def _regex(pattern: object) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise GuideError("response_format regex needs `regex`: a non-empty regular expression", "response_format")
    _compiles(pattern, "response_format")
    return pattern


def _grammar(grammar: object) -> str:
    if not isinstance(grammar, str) or not re.search(r"^\s*root\s*::=", grammar, re.MULTILINE):
        raise GuideError(
            "response_format ebnf needs `ebnf`: an EBNF grammar (xgrammar's) with a `root ::= …` rule",
            "response_format",
        )
    return grammar


def _compiles(pattern: str, param: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise GuideError(f"{param}: the regular expression {pattern!r} is invalid: {exc}", param) from None


def check_schema(schema: object, param: str, where: str = "schema", depth: int = 0) -> None:
    """The structure a JSON Schema must have for the grammar compiler: keywords with values of the right kind,
    references inside the schema only, patterns that compile. Unknown keywords pass (compilers ignore them)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise GuideError(f"{param}: {where} is not a JSON Schema (an object)", param)
    if depth > MAX_DEPTH:
        raise GuideError(f"{param}: {where} nests deeper than {MAX_DEPTH} levels", param)

    def bad(key: str, wanted: str) -> GuideError:
        return GuideError(f"{param}: {where}.{key} must be {wanted}", param)

    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(isinstance(k, str) and k in JSON_TYPES for k in kinds) or (isinstance(kind, list) and not kind):
        raise bad("type", "one of " + ", ".join(sorted(JSON_TYPES)) + " (or a list of them)")
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise bad("$ref", "a reference inside the schema (#/$defs/…)")
    for key in _ONE:
        if key in schema:
            check_schema(schema[key], param, f"{where}.{key}", depth + 1)
    for key in _MANY:
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                raise bad(key, "a non-empty list of schemas")
            for i, item in enumerate(schema[key]):
                check_schema(item, param, f"{where}.{key}[{i}]", depth + 1)
    for key in _MAP:
        if key in schema:
            if not isinstance(schema[key], Mapping):
                raise bad(key, "an object of schemas")
            for name, item in schema[key].items():
                check_schema(item, param, f"{where}.{key}.{name}", depth + 1)
    if "required" in schema and not (
        isinstance(schema["required"], list) and all(isinstance(r, str) for r in schema["required"])
    ):
        raise bad("required", "a list of property names")
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise bad("enum", "a non-empty list")
    for key in _COUNTS:
        if key in schema and not (type(schema[key]) is int and schema[key] >= 0):
            raise bad(key, "a non-negative integer")
    for key in _NUMBERS:
        if key in schema and not (isinstance(schema[key], (int, float)) and not isinstance(schema[key], bool)):
            raise bad(key, "a number")
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise bad("pattern", "a regular expression")
        _compiles(schema["pattern"], param)


# --- tool_choice -------------------------------------------------------------------------------------------------


def function_of(tool: object, where: str) -> Mapping[str, Any]:
    """A tool's `function` ({name, description, parameters}), checked."""
    function = (
        tool.get("function") if isinstance(tool, Mapping) and tool.get("type", "function") == "function" else None
    )
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise GuideError(
            f"{where}: a tool is {{'type': 'function', 'function': {{'name': …, 'parameters': …}}}}", "tools"
        )
    parameters = function.get("parameters", {"type": "object"})
    check_schema(parameters, "tools", f"{where}.function.parameters")
    return function


def chosen_name(tool_choice: object) -> str | None:
    """The function a named tool_choice names, else None ('auto', 'none', 'required' or unset)."""
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return None
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if isinstance(name, str) and name:
            return name
    raise GuideError(
        "tool_choice is 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': …}}", "tool_choice"
    )


def for_tool_choice(tools: Sequence[object], tool_choice: object) -> Guide | None:
    """The guide that makes the model call: a named tool's parameters, or for 'required' a non-empty list of
    {name, parameters} of the offered tools (what tools.REQUIRED reads back)."""
    functions = [function_of(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    name = chosen_name(tool_choice)
    if name is not None:
        found = [f for f in functions if f["name"] == name]
        if not found:
            raise GuideError(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return schema_guide(found[0].get("parameters", {"type": "object"}), "tool_choice")
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "parameters": f.get("parameters", {"type": "object"})},
            "required": ["name", "parameters"],
        }
        for f in functions
    ]
    return schema_guide({"type": "array", "minItems": 1, "items": {"anyOf": calls}}, "tool_choice")
