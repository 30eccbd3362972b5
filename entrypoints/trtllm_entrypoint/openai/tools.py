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
import re
import secrets
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

AUTO = "auto"


@dataclass(frozen=True)
class Family:
    name: str
    markers: tuple[str, ...]  # what opens a run of calls anywhere in the text
    at_start: bool  # calls may also open the answer without a marker (stripped special tokens; Llama's bare JSON)
    closing: str = ""  # what closes each call (hermes)
    separators: str = ""  # characters allowed between calls of one run, besides whitespace and commas
    name_form: bool = False  # name[ARGS]{…} (mistral v11+)
    id_alphabet: str = ""  # the ids this family's templates accept; empty: OpenAI's call_<hex>
    id_length: int = 0
    xml: bool = False  # qwen3_coder's <function=…><parameter=…> form


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


def new_call_id(family: Family | None = None) -> str:
    if family is not None and family.id_alphabet:
        return "".join(secrets.choice(family.id_alphabet) for _ in range(family.id_length))
    return f"call_{secrets.token_hex(12)}"


# --- events --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    fragment: str


Event = Text | CallStart | CallArguments


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


# --- JSON read as it streams ---------------------------------------------------------------------------------------


class _Value:
    """One JSON value read a character at a time: `push` says whether the character belongs to it; `done` once it is
    complete. Only the structure is checked (brackets, strings); json.loads has the last word."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.in_string = self.escaped = False
        self.started = self.done = False
        self.scalar = False

    def push(self, ch: str) -> bool:
        if self.done:
            return False
        if not self.started:
            if ch.isspace():
                return True
            self.started = True
            if ch in "{[":
                self.stack.append("}" if ch == "{" else "]")
            elif ch == '"':
                self.in_string = True
            elif ch in "-0123456789tfn":
                self.scalar = True
            else:
                raise ValueError(f"not JSON: {ch!r}")
            return True
        if self.scalar:
            if ch.isalnum() or ch in "+-.":
                return True
            self.done = True
            return False
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                self.done = not self.stack
            return True
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not self.stack or self.stack.pop() != ch:
                raise ValueError(f"unbalanced {ch!r}")
            self.done = not self.stack
        return True

    def end(self) -> None:
        """The text ended: a bare number or literal ends with it."""
        if self.scalar:
            self.done = True


class _CallObject:
    """A call as a JSON object {"name": …, "arguments"|"parameters": {…}, …} read as it streams: the name once its
    string is complete, the arguments' text as it comes (held while the name is not known yet)."""

    ARGUMENT_KEYS = ("arguments", "parameters")

    def __init__(self) -> None:
        self.whole = _Value()
        self.state = "open"  # open, key, colon, value, next
        self.key = ""
        self.key_value: _Value | None = None
        self.value: _Value | None = None
        self.value_text = ""
        self.name: str | None = None
        self.arguments = ""  # as read so far (raw JSON text)
        self.arguments_done = False
        self.string_arguments = False  # "arguments": "{\"a\": 1}" (a JSON string holding JSON)

    @property
    def done(self) -> bool:
        return self.whole.done

    def push(self, ch: str) -> bool:
        if not self.whole.push(ch):
            return False
        if self.state == "open":
            if not ch.isspace():
                if ch != "{":
                    raise ValueError("a call is a JSON object")
                self.state = "key"
        elif self.state == "key":
            if self.key_value is None:
                if ch == '"':
                    self.key_value = _Value()
                    self.key_value.push(ch)
                    self.key = ch
                elif not (ch.isspace() or ch == "}"):
                    raise ValueError("expected a key")
            else:
                self.key_value.push(ch)
                self.key += ch
                if self.key_value.done:
                    self.key, self.key_value, self.state = json.loads(self.key), None, "colon"
        elif self.state == "colon":
            if ch == ":":
                self.state, self.value, self.value_text = "value", _Value(), ""
        elif self.state == "value":
            assert self.value is not None
            if not self.value.push(ch):  # a bare number or literal ended at this character
                self._value_done()
                self.state = "next"
                return self._next(ch)
            if self.value.started:
                self._add(ch)
            if self.value.done:
                self._value_done()
                self.state = "next"
        elif self.state == "next":
            return self._next(ch)
        return True

    def _next(self, ch: str) -> bool:
        if ch == ",":
            self.state = "key"
        return True

    def _add(self, ch: str) -> None:
        self.value_text += ch
        if self.key in self.ARGUMENT_KEYS:
            if self.value_text == '"':
                self.string_arguments = True
            if not self.string_arguments:
                self.arguments += ch

    def _value_done(self) -> None:
        if self.key == "name":
            name = json.loads(self.value_text)
            if not isinstance(name, str):
                raise ValueError("a call's name is a string")
            self.name = name
        elif self.key in self.ARGUMENT_KEYS:
            if self.string_arguments:
                self.arguments = json.loads(self.value_text)
            if not isinstance(json.loads(self.arguments or "null"), dict):
                raise ValueError("a call's arguments are an object")
            self.arguments_done = True


# --- the parser ----------------------------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NAME_FORM = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?(?:\[ARGS\])?\s*(?=\{)")
_NAME_TAGS = ("[ARGS]", "[CALL_ID]")


@dataclass
class _Call:
    index: int
    id: str
    name: str
    sent: int = 0  # characters of arguments sent


@dataclass
class StreamParser:
    """Feed the model's text as it comes; each call returns the events that may be sent now."""

    family: Family
    tools: frozenset[str]  # the names the request offers
    new_id: Callable[[Family], str] = new_call_id
    calls: list[_Call] = field(default_factory=list)
    _buffer: str = ""  # text not consumed yet
    _mode: str = "start"  # start, text, calls (in a run, between calls), call (an object), name (name form), close
    _raw: str = ""  # the run's text since its last complete call: content again if what follows is not a call
    _current: _Call | None = None  # the call being read, once its name is known and sent
    _object: _CallObject | None = None
    _args: _Value | None = None  # name form: the arguments
    _args_text: str = ""
    _held_space: str = ""  # whitespace after a call: sent only if text follows

    def feed(self, piece: str) -> list[Event]:
        self._buffer += piece
        return self._run(final=False)

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self._mode in ("calls", "call", "name") and self._current is None and self._raw:
            events.append(Text(self._raw))  # a marker (or a held object) that never became a call
        self._buffer = self._raw = ""
        return _merge(events)

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        steps = {"start": self._start, "text": self._text, "calls": self._between, "call": self._in_object,
                 "name": self._in_name_form, "close": self._closing}  # fmt: skip
        while self._buffer and steps[self._mode](events, final):
            pass
        if final and self._mode == "call" and self._object is not None:
            self._object.whole.end()
        return _merge(events)

    # Each step consumes some of the buffer and returns True to go on, or False when it needs more text.
    def _start(self, events: list[Event], final: bool) -> bool:
        stripped = self._buffer.lstrip()
        opening = self._opening(stripped, final) if self.family.at_start else "no"
        if opening == "wait":
            return False
        if opening == "yes":
            self._raw, self._buffer, self._mode = self._buffer[: len(self._buffer) - len(stripped)], stripped, "calls"
        else:
            self._mode = "text"
        return True

    def _opening(self, text: str, final: bool) -> str:
        """Whether the answer opens with calls without their marker: yes, no, or wait (cannot tell yet)."""
        if not text:
            return "no" if final else "wait"
        for marker in self.family.markers:
            if text.startswith(marker):
                return "no"  # the text step finds it
            if marker.startswith(text):
                return "no" if final else "wait"
        if text[0] == "{":
            return "yes"
        if text[0] == "[" and self.family.name != "llama3_json":
            rest = text[1:].lstrip()
            return ("no" if final else "wait") if not rest else ("yes" if rest[0] == "{" else "no")
        match = _NAME.match(text) if self.family.name_form else None
        if match is None:
            return "no"
        name, after = match.group(), text[match.end() :]
        if not after:
            return "wait" if not final and any(tool.startswith(name) for tool in self.tools) else "no"
        if name not in self.tools:
            return "no"
        if after[0] == "{" or after.startswith(_NAME_TAGS):
            return "yes"
        return "wait" if not final and any(tag.startswith(after) for tag in _NAME_TAGS) else "no"

    def _text(self, events: list[Event], final: bool) -> bool:
        text = self._buffer
        found = [(i, m) for m in self.family.markers if (i := text.find(m)) >= 0]
        if found:
            i, marker = min(found)
            self._content(events, text[:i])
            self._buffer, self._raw, self._mode = text[i + len(marker) :], marker, "calls"
            return True
        keep = 0 if final else _partial_marker(text, self.family.markers)
        self._content(events, text[: len(text) - keep])
        self._buffer = text[len(text) - keep :]
        return False

    def _content(self, events: list[Event], text: str) -> None:
        if not text:
            return
        if self.calls and not text.strip():
            self._held_space += text
            return
        events.append(Text(self._held_space + text))
        self._held_space = ""

    def _between(self, events: list[Event], final: bool) -> bool:
        """In a run of calls, before one: an object, a list of them, or (name form) a name."""
        text = self._buffer
        skip = len(text) - len(text.lstrip(" \t\r\n[," + self.family.separators))
        self._raw += text[:skip]
        self._buffer = text = text[skip:]
        if not text:
            return False
        if text[0] == "{":
            self._object, self._mode = _CallObject(), "call"
            return True
        if text[0] == "]":
            self._buffer = text[1:]
            self._end_run()
            return True
        if self.family.name_form and _NAME.match(text):
            self._mode, self._args = "name", None
            return True
        return self._not_calls(events)

    def _in_object(self, events: list[Event], final: bool) -> bool:
        assert self._object is not None
        obj, text, used = self._object, self._buffer, 0
        try:
            for ch in text:
                if not obj.push(ch):
                    break
                used += 1
                if obj.done:
                    break
        except (ValueError, json.JSONDecodeError):
            return self._not_calls(events)
        self._raw += text[:used]
        self._buffer = text[used:]
        if obj.name is not None:
            if obj.name not in self.tools:
                return self._not_calls(events)
            self._arguments(events, obj.name, "" if obj.string_arguments else obj.arguments)
        if not obj.done:
            return False
        if obj.name is None:
            return self._not_calls(events)
        self._arguments(events, obj.name, obj.arguments if obj.arguments_done else "{}")
        self._call_done()
        self._mode = "close" if self.family.closing else "calls"
        return True

    def _in_name_form(self, events: list[Event], final: bool) -> bool:
        """name[ARGS]{…}, name[CALL_ID]id[ARGS]{…}, or name{…} where [ARGS] was stripped."""
        text = self._buffer
        if self._args is None:
            match = _NAME_FORM.match(text)
            if match is None:
                return False if not final and len(text) < 64 and "{" not in text else self._not_calls(events)
            if match.group(1) not in self.tools:
                return self._not_calls(events)
            self._raw += text[: match.end()]
            self._buffer, self._args, self._args_text = text[match.end() :], _Value(), ""
            self._arguments(events, match.group(1), "")
            return True
        value, used = self._args, 0
        try:
            for ch in text:
                if not value.push(ch):
                    break
                used += 1
                if value.done:
                    break
        except ValueError:
            return self._not_calls(events)
        assert self._current is not None
        self._raw += text[:used]
        self._args_text += text[:used]
        self._buffer = text[used:]
        self._arguments(events, self._current.name, self._args_text.lstrip())
        if not value.done:
            return False
        self._call_done()
        self._mode = "text"  # another call comes after its own marker
        return True

    def _arguments(self, events: list[Event], name: str, arguments: str) -> None:
        """Start the call (once), then send what is new of its arguments."""
        if self._current is None:
            self._current = _Call(len(self.calls), self.new_id(self.family), name)
            self.calls.append(self._current)
            events.append(CallStart(self._current.index, self._current.id, name))
        call = self._current
        if len(arguments) > call.sent:
            events.append(CallArguments(call.index, arguments[call.sent :]))
            call.sent = len(arguments)

    def _call_done(self) -> None:
        self._current, self._object, self._args, self._raw = None, None, None, ""

    def _closing(self, events: list[Event], final: bool) -> bool:
        """After a call, what closes it (hermes' </tool_call>); a model that leaves it out goes on with text."""
        text = self._buffer.lstrip()
        closing = self.family.closing
        if text.startswith(closing):
            self._buffer = text[len(closing) :]
        elif closing.startswith(text) and not final:
            return False
        self._end_run()
        return True

    def _end_run(self) -> None:
        self._raw, self._mode = "", "text"

    def _not_calls(self, events: list[Event]) -> bool:
        """What looked like a call is not: the run's text so far goes out as content (a call already sent stays as
        it was), and what follows is read as text again (it may hold further calls)."""
        if self._current is None:
            self._content(events, self._raw)
        self._raw = ""
        self._call_done()
        self._mode = "text"
        return True


@dataclass
class NamedCall:
    """A guided, named tool_choice: the model writes only the arguments of that one tool."""

    family: Family | None
    name: str
    new_id: Callable[[Family | None], str] = new_call_id
    _started: bool = False

    def feed(self, piece: str) -> list[Event]:
        events: list[Event] = []
        if not self._started:
            self._started = True
            events.append(CallStart(0, self.new_id(self.family), self.name))
        return _merge([*events, CallArguments(0, piece)])

    def finish(self) -> list[Event]:
        return [] if self._started else [*self.feed(""), CallArguments(0, "{}")]


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_XML_END = re.compile(r"\s*</function>")


@dataclass
class XmlCallParser:
    """Qwen3-Coder's calls: <tool_call><function=name><parameter=key>value</parameter>…</function></tool_call>. The
    values are text; each becomes JSON by the type its tool's schema gives the parameter. Arguments stream one
    parameter at a time."""

    family: Family
    schemas: Mapping[str, Mapping[str, Any]]  # tool name -> its parameters schema
    new_id: Callable[[Family], str] = new_call_id
    _buffer: str = ""
    _call: _Call | None = None
    _count: int = 0
    _params: int = 0
    _closing: bool = False  # after </function>: its </tool_call> may follow

    def feed(self, piece: str) -> list[Event]:
        self._buffer += piece
        return self._run(final=False)

    def finish(self) -> list[Event]:
        events = self._run(final=True)
        if self._call is not None:  # cut short: close what came
            events.append(CallArguments(self._call.index, "}" if self._params else "{}"))
            self._call = None
        events.append(Text(self._buffer))
        self._buffer = ""
        return _merge(events)

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        step = self._inside if self._call is not None else self._outside
        while self._buffer and step(events, final):
            step = self._inside if self._call is not None else self._outside
        return _merge(events)

    def _outside(self, events: list[Event], final: bool) -> bool:
        """Text until a <tool_call> and its <function=name>."""
        closing = self.family.closing
        if self._closing:
            rest = self._buffer.lstrip()
            if rest.startswith(closing):
                self._buffer = rest[len(closing) :]
            elif closing.startswith(rest) and not final:
                return False
            self._closing = False
        marker = self.family.markers[0]
        at = self._buffer.find(marker)
        if at < 0:
            keep = 0 if final else _partial_marker(self._buffer, (marker,))
            self._content(events, self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        match = _XML_FUNCTION.match(self._buffer, at + len(marker))
        if match is None:
            after = self._buffer[at + len(marker) :]
            if not final and ">" not in after and len(after) < 256:  # the function's name may still come
                self._content(events, self._buffer[:at])
                self._buffer = self._buffer[at:]
                return False
            self._content(events, self._buffer[: at + len(marker)])
            self._buffer = after
            return True
        name = match.group(1).strip()
        self._content(events, self._buffer[: at if name in self.schemas else match.end()])
        self._buffer = self._buffer[match.end() :]
        if name in self.schemas:
            self._call = _Call(self._count, self.new_id(self.family), name)
            self._count, self._params = self._count + 1, 0
            events.append(CallStart(self._call.index, self._call.id, name))
        return True

    def _content(self, events: list[Event], text: str) -> None:
        if text and (text.strip() or not self._count):  # whitespace between calls is no content
            events.append(Text(text))

    def _inside(self, events: list[Event], final: bool) -> bool:
        assert self._call is not None
        end = _XML_END.match(self._buffer)
        if end is not None:
            events.append(CallArguments(self._call.index, "}" if self._params else "{}"))
            self._buffer = self._buffer[end.end() :]
            self._call, self._closing = None, True
            return True
        match = _XML_PARAMETER.match(self._buffer)
        if match is None:
            return False
        key = match.group(1).strip()
        value = _typed(match.group(2), ((self.schemas.get(self._call.name) or {}).get("properties") or {}).get(key))
        lead = "{" if not self._params else ", "
        events.append(CallArguments(self._call.index, f"{lead}{json.dumps(key, ensure_ascii=False)}: {value}"))
        self._params += 1
        self._buffer = self._buffer[match.end() :]
        return True


def _typed(raw: str, schema: object) -> str:
    """A parameter's text as JSON of the type its schema gives (text where it does not parse as that type)."""
    kinds = (schema or {}).get("type") if isinstance(schema, Mapping) else None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if kinds != ["string"]:
        with contextlib.suppress(ValueError):
            value = json.loads(raw)
            if None in kinds or _fits(value, kinds):
                return json.dumps(value, ensure_ascii=False)
    return json.dumps(raw, ensure_ascii=False)


def _fits(value: object, kinds: list[object]) -> bool:
    checks = {"integer": lambda v: type(v) is int, "number": lambda v: type(v) in (int, float),
              "boolean": lambda v: type(v) is bool, "object": lambda v: isinstance(v, dict),
              "array": lambda v: isinstance(v, list), "null": lambda v: v is None}  # fmt: skip
    return any(checks.get(str(kind), lambda v: False)(value) for kind in kinds)


def reader(family: Family, functions: Sequence[Mapping[str, Any]]) -> StreamParser | XmlCallParser:
    """The parser for a family, knowing the offered tools (their `function` objects)."""
    if family.xml:
        return XmlCallParser(family, {str(f["name"]): f.get("parameters") or {} for f in functions})
    return StreamParser(family, frozenset(str(f["name"]) for f in functions))


def _partial_marker(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of text could be the start of a marker."""
    keep = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), keep, -1):
            if text.endswith(marker[:size]):
                keep = size
                break
    return keep


def _merge(events: list[Event]) -> list[Event]:
    """Adjacent texts (and adjacent fragments of one call) as one event; empty ones dropped."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, Text):
            if not event.text:
                continue
            if isinstance(last, Text):
                event = Text(last.text + event.text)
                out.pop()
        elif isinstance(event, CallArguments):
            if not event.fragment:
                continue
            if isinstance(last, CallArguments) and last.index == event.index:
                event = CallArguments(event.index, last.fragment + event.fragment)
                out.pop()
        out.append(event)
    return out


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
