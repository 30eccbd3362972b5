"""JSON read a character at a time, as a model streams it: where a value ends, and a tool call's object read as it
comes (its name once complete, its arguments' text as it grows). Only the structure is checked here (brackets,
strings); json.loads has the last word on every complete value."""

from __future__ import annotations

import json


class JsonValue:
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


class CallObject:
    """A call as a JSON object {"name": …, "arguments"|"parameters": {…}, …} read as it streams: the name once its
    string is complete, the arguments' text as it comes (held while the name is not known yet)."""

    ARGUMENT_KEYS = ("arguments", "parameters")

    def __init__(self) -> None:
        self.whole = JsonValue()
        self.state = "open"  # open, key, colon, value, next
        self.key = ""
        self.key_value: JsonValue | None = None
        self.value: JsonValue | None = None
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
                    self.key_value = JsonValue()
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
                self.state, self.value, self.value_text = "value", JsonValue(), ""
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
