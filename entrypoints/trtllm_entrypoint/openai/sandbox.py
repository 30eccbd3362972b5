"""The template engine the front renders chat templates with: jinja2's sandbox, from the vendored copy
(vendor.lock.json puts it first on the front's path, contract.FRONT_DIR), never older than MIN_JINJA2.

A model repository's chat template comes from the hub: it is untrusted input, and the sandbox is what keeps it from
the worker's process. jinja2 below 3.1.5 and 3.1.6 has published sandbox escapes (CVE-2024-56326: str.format reached
indirectly; CVE-2025-27516: the |attr filter reaching format), and base images older than March 2025 carry such a
jinja2. So the front refuses to start on an older one rather than render with it.

The sandbox keeps a template from Python's internals and bounds `range()`; `environment()` bounds, besides, each
single operation that could allocate without limit (`"a" * 10**10`, `10 ** 10 ** 9`, a format width of a
billion, `center`/`indent` widths) to MAX_VALUE_CHARS. Time and total output are bounded where the template is
rendered (openai/cpu.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trtllm_entrypoint.errors import UsageError

MIN_JINJA2 = (3, 1, 6)
MAX_VALUE_CHARS = 1 << 24  # no single string or list a template makes may be longer (the body limit is 16 MiB)
# A width or precision of 7 digits or more in a format string: a million characters from one field.
_HUGE_FORMAT = re.compile(r"[0-9]{7,}")


class TooBig(Exception):  # noqa: N818
    """A template operation that would make a value larger than MAX_VALUE_CHARS."""


def _sized(value: object) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def check_binop(operator: str, left: object, right: object) -> None:
    """Refuse `left <operator> right` when its result would pass MAX_VALUE_CHARS (or, for int powers, as many bits)."""
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            size = _sized(seq)
            if size is not None and isinstance(times, int) and size * times > MAX_VALUE_CHARS:
                raise TooBig(f"a template made a value of {size} x {times} items")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        if right * abs(left).bit_length() > MAX_VALUE_CHARS:
            raise TooBig(f"a template computed {left} ** {right}")
    elif operator == "%" and isinstance(left, str) and _HUGE_FORMAT.search(left):
        raise TooBig("a template used a format width of a million characters or more")


def _width_bounded(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def bounded(value: object, *args: Any, **kwargs: Any) -> Any:
        width = args[0] if args else kwargs.get("width")
        if isinstance(width, int) and width > MAX_VALUE_CHARS:
            raise TooBig(f"a template asked {name} for a width of {width}")
        return fn(value, *args, **kwargs)

    return bounded


def _format_bounded(fn: Callable[..., Any]) -> Callable[..., Any]:
    def bounded(value: object, *args: Any, **kwargs: Any) -> Any:
        check_binop("%", value, args)
        return fn(value, *args, **kwargs)

    return bounded


def environment(**options: Any) -> Any:
    """A jinja2 sandbox (immutable: templates cannot change the request's values) whose single operations are
    bounded (check_binop, format strings, widths); `options` as jinja2.Environment's."""
    module = jinja2()

    class Bounded(module.sandbox.ImmutableSandboxedEnvironment):  # type: ignore[name-defined,misc]
        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value: Any) -> Any:  # str.format and format_map, wherever they are reached
            wrapped = super().wrap_str_format(value)
            if wrapped is not None and _HUGE_FORMAT.search(value.__self__):
                raise TooBig("a template used a format width of a million characters or more")
            return wrapped

    env = Bounded(**options)
    for name in ("center", "indent"):
        env.filters[name] = _width_bounded(env.filters[name], name)
    env.filters["format"] = _format_bounded(env.filters["format"])
    return env


def version_of(text: str) -> tuple[int, ...]:
    """(3, 1, 6) of "3.1.6", "3.1.6.dev0" or "3.2.0rc1": the leading release numbers."""
    found = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def jinja2() -> ModuleType:
    """jinja2, with its sandbox imported, once its version is at least MIN_JINJA2."""
    import jinja2 as module  # noqa: PLC0415  (lazy: only the front's processes render templates)
    import jinja2.sandbox  # noqa: F401, PLC0415

    found = getattr(module, "__version__", "")
    if version_of(found) < MIN_JINJA2:
        wanted = ".".join(map(str, MIN_JINJA2))
        raise UsageError(
            f"the OpenAI front renders chat templates with jinja2 >= {wanted} (sandbox fixes), and found "
            f"{found or 'an unknown version'} at {getattr(module, '__file__', '?')}",
            "build the image with build.py, which vendors jinja2 (vendor.lock.json) on the front's own path",
        )
    return module
