"""Typed reads of an environment mapping: each value stripped (empty counts as unset), parsed by the variable table
(variables.py) and refused with one line naming the variable, the value and what is allowed.

settings.py, credentials.py and group.py read their variables through `Env`; nothing here knows what a variable means.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from trtllm_entrypoint.config.variables import FALSE_WORDS, OPEN_APIS, TRUE_WORDS, VARIABLES
from trtllm_entrypoint.errors import UsageError

WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
TOKEN = re.compile(r"[!-~]+")  # printable ASCII without spaces: it goes into an HTTP header


def bad(name: str, value: object, allowed: str) -> UsageError:
    shown = str(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return UsageError(f"{name}={shown!r} is not allowed: expected {allowed}")


class Env:
    """Typed reads of one environment mapping; every failure is a one-line UsageError."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ
        self.given: set[str] = set()  # names read that had a value

    def text(self, name: str) -> str | None:
        value = self.environ.get(name, "").strip()
        if value:
            self.given.add(name)
        return value or None

    def integer(self, name: str, default: int | None = None) -> int:
        """A whole number within the table's bounds (and choices, if any); `default` when the table's is derived."""
        variable = VARIABLES[name]
        value = self.whole(name, cast(int, variable.low), cast(int, variable.high))
        if value is None:
            return cast(int, variable.default if default is None else default)
        if variable.choices and value not in variable.choices:
            raise bad(name, value, variable.allowed_text)
        return value

    def whole(self, name: str, low: int, high: int | None = None) -> int | None:
        """A whole number from `low` to `high` (no upper bound: None), or None when unset."""
        raw = self.text(name)
        if raw is None:
            return None
        allowed = f"a whole number from {low} to {high}" if high is not None else f"a whole number of at least {low}"
        if not WHOLE_NUMBER.fullmatch(raw):  # int() alone takes "٨", and str.isdigit() takes "²"
            raise bad(name, raw, allowed)
        value = int(raw)
        if value < low or (high is not None and value > high):
            raise bad(name, raw, allowed)
        return value

    def fraction(self, name: str) -> float:
        raw = self.text(name)
        if raw is None:
            return cast(float, VARIABLES[name].default)
        allowed = "a number greater than 0 and at most 1 (e.g. 0.9)"
        if not DECIMAL.fullmatch(raw):
            raise bad(name, raw, allowed)
        value = float(raw)
        if math.isnan(value) or not 0 < value <= 1:
            raise bad(name, raw, allowed)
        return value

    def boolean(self, name: str) -> bool:
        raw = self.text(name)
        if raw is None:
            return cast(bool, VARIABLES[name].default)
        if raw.lower() in TRUE_WORDS:
            return True
        if raw.lower() in FALSE_WORDS:
            return False
        raise bad(name, raw, "one of " + "/".join(TRUE_WORDS + FALSE_WORDS))

    def choice(self, name: str) -> str:
        variable = VARIABLES[name]
        raw = self.text(name)
        if raw is None:
            return cast(str, variable.default)
        if raw.lower() not in variable.choices:
            raise bad(name, raw, "one of " + ", ".join(map(str, variable.choices)))
        return raw.lower()

    def names(self, name: str) -> tuple[str, ...]:
        """A comma-separated list of the table's choices, in the given order; `none` is the empty list."""
        variable = VARIABLES[name]
        raw = self.text(name)
        if raw is None:
            return cast(tuple[str, ...], variable.default)
        names = [part.strip().lower() for part in raw.split(",")]
        if names == [OPEN_APIS]:
            return ()
        unknown = [part for part in names if part not in variable.choices]
        if unknown:
            allowed = f"'{OPEN_APIS}' or a comma-separated list of {', '.join(map(str, variable.choices))}"
            raise bad(name, raw, f"{allowed} (unknown: {', '.join(repr(n) for n in unknown)})")
        return tuple(dict.fromkeys(names))

    def template_safe(self, name: str) -> str | None:
        """A value that lands in the generated config.pbtxt files, where `${` would read as an unfilled placeholder."""
        raw = self.text(name)
        if raw is not None and "${" in raw:
            raise bad(name, raw, "a value without '${' (it would read as an unfilled template placeholder)")
        return raw

    def path(self, name: str) -> Path | None:
        raw = self.template_safe(name)
        return None if raw is None else Path(os.path.abspath(raw))
