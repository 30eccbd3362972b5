"""A small reader for Triton's protobuf text format (config.pbtxt), stdlib only.

The images may lack the protobuf package, and we only need names: the model's name and backend, its inputs and
outputs, ensemble steps and parameter keys. `parse` returns nested dicts; fields that protobuf declares repeated (and
any field written twice or as a `[...]` list) are lists.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trtllm_entrypoint.errors import EntrypointError

# Repeated fields of Triton's ModelConfig that the repository code reads; always lists, even when written once.
REPEATED = frozenset(
    {
        "input",
        "output",
        "parameters",
        "instance_group",
        "step",
        "input_map",
        "output_map",
        "dims",
        "preferred_batch_size",
        "gpus",
        "batch_input",
        "batch_output",
        "dependencies",
    }
)

_PUNCT = "{}[]:,;<>"
_NUMBER = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?|inf|nan)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


@dataclass(frozen=True)
class Token:
    kind: str  # "punct", "string", "number", "ident", "end"
    value: Any
    line: int
    col: int


def _error(source: str, line: int, col: int, message: str) -> EntrypointError:
    return EntrypointError(
        f"{source}:{line}:{col}: {message}",
        "the file is not valid protobuf text format; compare it with the backend's template",
    )


def _unescape(body: str, source: str, line: int, col: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[nxt])
            i += 2
        elif nxt in "xX":
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :])
            if not digits:
                raise _error(source, line, col + i, "\\x escape without hex digits")
            out.append(chr(int(digits.group(), 16)))
            i += 2 + len(digits.group())
        elif nxt in "01234567":
            octal = "".join(itertools.takewhile(lambda c: c in "01234567", body[i + 1 : i + 4]))
            out.append(chr(int(octal, 8)))
            i += 1 + len(octal)
        else:
            raise _error(source, line, col + i, f"unknown escape \\{nxt} in a string")
    return "".join(out)


def tokenize(text: str, source: str = "<text>") -> Iterator[Token]:
    line, line_start, i = 1, 0, 0
    while i < len(text):
        ch = text[i]
        col = i - line_start + 1
        if ch == "\n":
            line, line_start = line + 1, i + 1
            i += 1
        elif ch.isspace():
            i += 1
        elif ch == "#":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif ch in _PUNCT:
            yield Token("punct", ch, line, col)
            i += 1
        elif ch in "\"'":
            match = re.compile(rf"{ch}((?:[^{ch}\\\n]|\\.)*){ch}").match(text, i)
            if not match:
                raise _error(source, line, col, "unterminated string")
            yield Token("string", _unescape(match.group(1), source, line, col + 1), line, col)
            i = match.end()
        elif (number := _NUMBER.match(text, i)) and not _IDENT.match(text, i):
            yield Token("number", _number(number.group()), line, col)
            i = number.end()
        elif ident := _IDENT.match(text, i):
            yield Token("ident", ident.group(), line, col)
            i = ident.end()
        else:
            raise _error(source, line, col, f"unexpected character {ch!r}")
    yield Token("end", None, line, i - line_start + 1)


def _number(raw: str) -> int | float:
    try:
        return int(raw, 0)
    except ValueError:
        return float(raw.rstrip("fF"))


class _Parser:
    def __init__(self, text: str, source: str):
        self.source = source
        self.tokens = list(tokenize(text, source))
        self.pos = 0

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def unexpected(self, token: Token, wanted: str) -> EntrypointError:
        found = "end of file" if token.kind == "end" else repr(token.value)
        return _error(self.source, token.line, token.col, f"expected {wanted}, found {found}")

    def message(self, closer: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        while True:
            token = self.peek()
            if closer is None and token.kind == "end":
                return fields
            if token.kind == "punct" and token.value == closer:
                self.take()
                return fields
            if token.kind != "ident":
                raise self.unexpected(token, "a field name" + (f" or '{closer}'" if closer else ""))
            self.take()
            self._store(fields, token.value, self.field_value())
            if self.peek().kind == "punct" and self.peek().value in ",;":
                self.take()

    def _store(self, fields: dict[str, Any], name: str, value: tuple[bool, Any]) -> None:
        is_list, item = value
        if name in fields:
            existing = fields[name] if isinstance(fields[name], list) else [fields[name]]
            fields[name] = existing + (item if is_list else [item])
        elif is_list or name in REPEATED:
            fields[name] = item if is_list else [item]
        else:
            fields[name] = item

    def field_value(self) -> tuple[bool, Any]:
        """(written as a list, value) for what follows a field name."""
        token = self.peek()
        has_colon = token.kind == "punct" and token.value == ":"
        if has_colon:
            self.take()
            token = self.peek()
        if token.kind == "punct" and token.value in "{<":
            self.take()
            return False, self.message("}" if token.value == "{" else ">")
        if token.kind == "punct" and token.value == "[":  # a list may omit the colon: `input [ … ]`
            self.take()
            return True, self.list_items()
        if not has_colon:
            raise self.unexpected(token, "':', '{' or '['")
        return False, self.scalar()

    def list_items(self) -> list[Any]:
        items: list[Any] = []
        if self.peek().kind == "punct" and self.peek().value == "]":
            self.take()
            return items
        while True:
            token = self.peek()
            if token.kind == "punct" and token.value in "{<":
                self.take()
                items.append(self.message("}" if token.value == "{" else ">"))
            else:
                items.append(self.scalar())
            separator = self.take()
            if separator.kind == "punct" and separator.value == "]":
                return items
            if separator.kind != "punct" or separator.value != ",":
                raise self.unexpected(separator, "',' or ']'")

    def scalar(self) -> Any:
        token = self.take()
        if token.kind == "string":
            parts = [token.value]
            while self.peek().kind == "string":  # adjacent strings concatenate, as in protobuf
                parts.append(self.take().value)
            return "".join(parts)
        if token.kind in ("number", "ident"):
            return token.value
        raise self.unexpected(token, "a value")


def parse(text: str, source: str = "<text>") -> dict[str, Any]:
    """The fields of a protobuf text-format message; raises EntrypointError naming line:col on bad syntax."""
    return _Parser(text, source).message(None)


def map_entries(entries: list[Any] | None) -> dict[str, Any]:
    """A protobuf map written as repeated `{ key: … value: … }` (parameters, input_map, output_map) as a dict."""
    return {entry.get("key"): entry.get("value") for entry in entries or []}


def names(entries: list[Any] | None) -> list[str]:
    """The `name` of each input or output."""
    return [entry.get("name") for entry in entries or []]
