"""The parsers that read tool calls out of a model's text as it streams (tools.py picks one per family): markers and
JSON objects (StreamParser) and a guided named call (NamedCall); Qwen3-Coder's XML is xml_tool_parser.py's. Each is fed
text and returns events: text, a call's start (index, id, name), a fragment of its arguments."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

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
