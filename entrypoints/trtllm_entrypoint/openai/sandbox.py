"""The template engine the front renders chat templates with: jinja2's sandbox, from the vendored copy
(vendor.lock.json puts it first on the front's path, contract.FRONT_DIR), never older than MIN_JINJA2.

A model repository's chat template comes from the hub: it is untrusted input, and the sandbox is what keeps it from
the worker's process. jinja2 below 3.1.5 and 3.1.6 has published sandbox escapes (CVE-2024-56326: str.format reached
indirectly; CVE-2025-27516: the |attr filter reaching format), and base images older than March 2025 carry such a
jinja2. So the front refuses to start on an older one rather than render with it.
"""

from __future__ import annotations

import re
from types import ModuleType

from trtllm_entrypoint.errors import UsageError

MIN_JINJA2 = (3, 1, 6)


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
