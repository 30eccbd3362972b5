"""The parsers that read tool calls out of a model's text as it streams (tools.py picks one per family): markers and
JSON objects (StreamParser), Qwen3-Coder's XML (XmlCallParser), and a guided named call (NamedCall). Each is fed text
and returns events: text, a call's start (index, id, name), a fragment of its arguments."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trtllm_entrypoint.openai.json_stream import CallObject, JsonValue


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
    _object: CallObject | None = None
    _args: JsonValue | None = None  # name form: the arguments
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
            self._object, self._mode = CallObject(), "call"
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
            self._buffer, self._args, self._args_text = text[match.end() :], JsonValue(), ""
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
