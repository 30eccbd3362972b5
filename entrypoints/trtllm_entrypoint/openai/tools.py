"""Tool calls: the format a model writes them in (its family), and the model's text turned back into OpenAI
`tool_calls`, whole or while it streams. Pure: the front feeds text and writes what comes out.

A family is named as vLLM and Triton's frontend name their parsers where they have one:
    hermes       <tool_call>{"name": …, "arguments": {…}}</tool_call>           Qwen 2.5/3, Hermes 2/3
    llama3_json  {"name": …, "parameters": {…}} (or `arguments`), `;` between several, optionally after
                 <|python_tag|>                                                   Llama 3.1/3.2/3.3
    mistral      [TOOL_CALLS][{"name": …, "arguments": {…}}, …]  (tokenizers v3 to v7), or
                 [TOOL_CALLS]name[ARGS]{…} / name[CALL_ID]id[ARGS]{…}  (v11 and later, Mistral Small 3.x…)
    granite      <|tool_call|>[{"name": …, "arguments": {…}}, …]                  Granite 3.x
    qwen3_coder  <tool_call><function=name><parameter=key>value</parameter>…</function></tool_call>
                                                                                  Qwen3-Coder (values typed by the
                                                                                  tool's parameter schema)
Detokenizers that skip special tokens drop markers such as [TOOL_CALLS] or [ARGS]: a family whose calls can open the
answer also recognises them there without the marker (`[{…`, `name{…`, `{…`), but only for a tool the request offers.

The stream parser emits what OpenAI streams: text as content; per call one delta with its index, id, type and name,
then its arguments in fragments as the model writes them. A whole answer is the same parser run over the whole text.
"""

from __future__ import annotations

import contextlib
import json
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtllm_entrypoint.openai.tool_parsers import (
    CallArguments,
    CallStart,
    Event,
    Family,
    NamedCall,
    StreamParser,
    Text,
)
from trtllm_entrypoint.openai.xml_tool_parser import XmlCallParser

__all__ = ["CallArguments", "CallStart", "Event", "Family", "NamedCall", "StreamParser", "Text", "XmlCallParser"]

AUTO = "auto"


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("hermes", ("<tool_call>",), at_start=False, closing="</tool_call>"),
        Family("llama3_json", ("<|python_tag|>",), at_start=True, separators=";"),
        # Mistral's templates refuse tool call ids that are not 9 letters or digits.
        Family(
            "mistral",
            ("[TOOL_CALLS]",),
            at_start=True,
            name_form=True,
            id_alphabet=string.ascii_letters + string.digits,
            id_length=9,
        ),
        Family("granite", ("<|tool_call|>",), at_start=True),
        Family("qwen3_coder", ("<tool_call>",), at_start=False, closing="</tool_call>", xml=True),
    )
}

# What a guided `tool_choice: required` makes any model write: a JSON list of {"name", "parameters"} (guided.py).
REQUIRED = Family("required", (), at_start=True)

# What a chat template's text shows about the format its model writes calls in, checked in this order; a family of
# None: the template has calls of a format no parser here reads (its tools are refused rather than misread).
TEMPLATE_SIGNS: tuple[tuple[str, str | None], ...] = (
    ("<function=", "qwen3_coder"),  # Qwen3-Coder's XML parameters inside <tool_call>
    ("<arg_key>", None),  # GLM 4.5/4.6: name and <arg_key>/<arg_value> pairs inside <tool_call>
    ("<|channel|>", None),  # gpt-oss (harmony)
    ("tool▁calls▁begin", None),  # DeepSeek V3/R1
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call|>", "granite"),
    ("<|python_tag|>", "llama3_json"),
)
# config.json's model_type, for templates that show no sign.
MODEL_TYPES = {"qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes",
               "mistral": "mistral", "mistral3": "mistral", "granite": "granite"}  # fmt: skip


def detect(template: str | None, model_type: str | None) -> str | None:
    """The family the template (else config.json's model_type) shows, or None when none is known."""
    for sign, family in TEMPLATE_SIGNS:
        if template and sign in template:
            return family
    if template and "<|start_header_id|>" in template and "parameters" in template and "tools" in template:
        return "llama3_json"  # Llama 3.1+ without the python tag in the template text
    return MODEL_TYPES.get(model_type or "")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object

    def to_openai(self) -> dict[str, object]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def delta(event: CallStart | CallArguments) -> dict[str, object]:
    """One entry of a chunk's `delta.tool_calls`, as OpenAI streams them."""
    if isinstance(event, CallStart):
        function = {"name": event.name, "arguments": ""}
        return {"index": event.index, "id": event.id, "type": "function", "function": function}
    return {"index": event.index, "function": {"arguments": event.fragment}}


def reader(family: Family, functions: Sequence[Mapping[str, Any]]) -> StreamParser | XmlCallParser:
    """The parser for a family, knowing the offered tools (their `function` objects)."""
    if family.xml:
        return XmlCallParser(family, {str(f["name"]): f.get("parameters") or {} for f in functions})
    return StreamParser(family, frozenset(str(f["name"]) for f in functions))


@dataclass(frozen=True)
class Parsed:
    content: str | None
    calls: tuple[ToolCall, ...]


def assemble(events: Iterable[Event]) -> Parsed:
    """Events gathered into one answer: content, and each call with its whole arguments (normalised JSON)."""
    content: list[str] = []
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, Text):
            content.append(event.text)
        elif isinstance(event, CallStart):
            names[event.index] = (event.id, event.name)
            arguments.setdefault(event.index, [])
        else:
            arguments.setdefault(event.index, []).append(event.fragment)
    calls = []
    for index, (call_id, name) in sorted(names.items()):
        text = "".join(arguments.get(index, [])) or "{}"
        with contextlib.suppress(json.JSONDecodeError):  # cut short (length): its arguments as they came
            text = json.dumps(json.loads(text), ensure_ascii=False)
        calls.append(ToolCall(call_id, name, text))
    joined = "".join(content)
    return Parsed(joined if joined.strip() or not calls else None, tuple(calls))


def parse(family: Family, functions: Sequence[Mapping[str, Any]], text: str) -> Parsed:
    """A whole answer: content and calls, by the same parser as a stream."""
    parser = reader(family, functions)
    return assemble([*parser.feed(text), *parser.finish()])
