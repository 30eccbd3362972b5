"""Which of Triton's APIs stay closed to clients without the admin key, and the tritonserver flags that close them.

Triton checks one header per restricted API: `admin-key` over HTTP, `triton-grpc-protocol-admin-key` over gRPC
(it prefixes gRPC keys itself). Measured on 2.51: the flag value is `<apis>:<header>=<value>` (the help text's
`<apis>,<header>=<value>` is refused), restricted routes answer 403 over HTTP and UNAVAILABLE over gRPC without the
header, and a value may hold any visible ASCII. Without TRITON_ADMIN_KEY the key is random per start and never
shown, so the restricted APIs are unreachable (Triton refuses an empty value).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trtllm_entrypoint.errors import UsageError

if TYPE_CHECKING:
    from trtllm_entrypoint.facts import ImageFacts
    from trtllm_entrypoint.settings import Settings

# Triton's names (src/restricted_features.h, unchanged from 2.40 to 2.71) except `health`: the image's
# HEALTHCHECK and Kubernetes probes call it without headers.
APIS = ("metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace", "logging")
# What no inference client needs: memory regions, loading code, per-model numbers, traces and verbose logs.
DEFAULT_APIS = ("shared-memory", "model-repository", "statistics", "trace", "logging")
# Closed without a key, these would make the model unusable.
CLIENT_APIS = ("metadata", "inference", "model-config")
OPEN = "none"
HEADER = "admin-key"
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"
FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")
# Triton's OpenAI frontend (server r25.09 on) restricts its own routes: `--openai-restricted-api <apis> <header>
# <value>`, its APIs being inference, model-repository (GET /v1/models; later also loading models), metrics and
# health. Our names map onto them; the others name nothing the frontend serves. Health stays open, as above.
OPENAI_FLAG = "--openai-restricted-api"
OPENAI_APIS = {"inference": "inference", "model-repository": "model-repository", "statistics": "metrics"}
KEY_LENGTH = (16, 4096)
# Visible ASCII (valid in HTTP headers and gRPC metadata) except `"` and `\`, which JSON escapes: the log masks a
# key by its text, in JSON lines too.
KEY_CHARACTERS = frozenset(chr(c) for c in range(0x21, 0x7F)) - {'"', "\\"}


def parse_apis(raw: str | None) -> tuple[str, ...]:
    """RESTRICTED_APIS: unset -> the default list; `none` -> nothing restricted; else known names, in given order."""
    if raw is None:
        return DEFAULT_APIS
    names = [name.strip().lower() for name in raw.split(",")]
    if names == [OPEN]:
        return ()
    unknown = [name for name in names if name not in APIS]
    if unknown:
        shown = raw if len(raw) <= 80 else raw[:77] + "..."
        raise UsageError(
            f"RESTRICTED_APIS={shown!r} is not allowed: expected '{OPEN}' or a comma-separated list of "
            f"{', '.join(APIS)} (unknown: {', '.join(repr(n) for n in unknown)})"
        )
    return tuple(dict.fromkeys(names))


def check_key(key: str, variable: str) -> str:
    """The key as given; the message of a bad one never shows it."""
    low, high = KEY_LENGTH
    if not low <= len(key) <= high or not set(key) <= KEY_CHARACTERS:
        raise UsageError(
            f"{variable} is not allowed (the value is not shown): expected {low} to {high} visible "
            "ASCII characters without spaces, '\"' or '\\'",
            "generate one with: openssl rand -hex 32",
        )
    return key


def random_key() -> str:
    return secrets.token_urlsafe(32)


def flags_in(args: Sequence[str]) -> list[str]:
    """The restriction flags a command line sets itself."""
    return [flag for flag in (arg.split("=", 1)[0] for arg in args) if flag in FLAGS]


def check_relations(apis: tuple[str, ...], key_generated: bool) -> None:
    closed = [api for api in apis if api in CLIENT_APIS]
    if closed and key_generated:
        raise UsageError(
            f"RESTRICTED_APIS closes {', '.join(closed)} but no TRITON_ADMIN_KEY or "
            "TRITON_ADMIN_KEY_FILE is set: no client could use the model",
            "set TRITON_ADMIN_KEY_FILE to a mounted secret, or leave those APIs out",
        )


@dataclass(frozen=True)
class Restriction:
    """What this start closes: a value to print and test; `argv()` holds the key, so never log it unmasked."""

    apis: tuple[str, ...]
    key: str = field(repr=False)
    supported: bool  # the program that serves has the flags (tritonserver: matrix capability `restricted_apis`)
    openai: bool = False  # the program is Triton's OpenAI frontend, which takes OPENAI_FLAG

    def argv(self) -> list[str]:
        if not self.apis or not self.supported:
            return []
        if self.openai:
            return [OPENAI_FLAG, ",".join(self.apis), HEADER, self.key]
        value = f"{','.join(self.apis)}:{HEADER}={self.key}"
        return [f"{flag}={value}" for flag in FLAGS]


def restriction(settings: Settings, facts: ImageFacts) -> Restriction:
    """tritonserver's: with FRONTEND=openai no tritonserver runs (openai_restriction is the frontend's)."""
    return Restriction(
        apis=settings.restricted_apis,
        key=settings.admin_key,
        supported=facts.restricted_apis and settings.frontend == "triton",
    )


def openai_restriction(settings: Settings, facts: ImageFacts) -> Restriction:
    """The OpenAI frontend's routes that RESTRICTED_APIS closes, where this image's frontend takes OPENAI_FLAG
    (capability `openai_restricted_api`), with the same admin key."""
    apis = tuple(dict.fromkeys(OPENAI_APIS[api] for api in settings.restricted_apis if api in OPENAI_APIS))
    return Restriction(
        apis=apis,
        key=settings.admin_key,
        supported=settings.frontend == "openai" and "openai_restricted_api" in facts.features,
        openai=True,
    )


def start_warnings(settings: Settings, facts: ImageFacts) -> list[str]:
    """What stays open at this start, for the start-up log."""
    if flags_in(settings.triton_args):
        return []  # a `tritonserver …` command line of the user's own that restricts APIs itself
    if not settings.restricted_apis and settings.frontend == "openai" and not settings.openai_kserve_frontends:
        return ["RESTRICTED_APIS=none: every route of the OpenAI frontend (/v1/models, /metrics) is open to any client"]
    if not settings.restricted_apis:
        return [
            "RESTRICTED_APIS=none: every Triton API (shared memory, model repository, logging, trace, "
            "statistics) is open to any client that reaches the ports"
        ]
    what = ", ".join(settings.restricted_apis)
    if settings.frontend == "openai":
        closed = openai_restriction(settings, facts)
        if not closed.supported:
            first = facts.first_tag_with.get("openai_restricted_api", "a later image")
            return [
                f"FRONTEND=openai: the OpenAI frontend of image {facts.tag} cannot restrict its routes "
                f"(--openai-restricted-api comes with {first}); /v1/models and /metrics are open to any client"
            ]
        return []
    if not facts.restricted_apis:
        return [f"tritonserver {facts.triton} in image {facts.tag} cannot restrict APIs; {what} stay open"]
    return []
