"""Qwen3-Coder's tool calls read out of a model's text as it streams (tools.py picks it for the qwen3_coder family):
<function=name><parameter=key>value</parameter>…</function>, each value typed by its tool's schema. It is fed text and
returns tool_parsers.py's events."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trtllm_entrypoint.openai.tool_parsers import (
    CallArguments,
    CallStart,
    Event,
    Family,
    Text,
    _Call,
    _merge,
    _partial_marker,
    new_call_id,
)

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
