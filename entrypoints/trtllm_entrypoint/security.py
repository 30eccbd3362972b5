"""Which of Triton's APIs stay closed to clients without the admin key, and the tritonserver flags that close them.

Triton checks one header per restricted API: `admin-key` over HTTP, `triton-grpc-protocol-admin-key` over gRPC
(it prefixes gRPC keys itself). Measured on 2.51: the flag value is `<apis>:<header>=<value>` (the help text's
`<apis>,<header>=<value>` is refused), restricted routes answer 403 over HTTP and UNAVAILABLE over gRPC without the
header, and a value may hold any visible ASCII. Without TRITON_ADMIN_KEY the key is random per start and never
shown, so the restricted APIs are unreachable (Triton refuses an empty value).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_entrypoint.facts import ImageFacts
from trtllm_entrypoint.server_args import OPENAI_RESTRICTION_FLAG, RESTRICTION_FLAGS, restriction_flags, value_words
from trtllm_entrypoint.settings import Settings

HEADER = "admin-key"
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"
# Triton's OpenAI frontend (server r25.09 on) restricts its own routes: `--openai-restricted-api <apis> <header>
# <value>`. Which groups of routes a tag's frontend defines is data (capabilities.yaml, features
# openai_api_group_<group>); each is closed by one of our API names, health by none (probes call it, as with Triton).
# A group not named here is closed whenever any API is: a new group is never left open by default.
OPENAI_GROUP_FEATURE = "openai_api_group_"
OPENAI_GROUPS: dict[str, str | None] = {
    "inference": "inference",
    "model-repository": "model-repository",
    "model-management": "model-repository",  # loading and unloading, should a frontend split them off
    "metrics": "statistics",
    "health": None,
}


@dataclass(frozen=True)
class Restriction:
    """What this start closes: a value to print and test; `argv()` holds the key, so never log it unmasked."""

    apis: tuple[str, ...]
    key: str = field(repr=False)
    supported: bool  # the program that serves has the flags (tritonserver: capability `restricted_apis`)
    openai: bool = False  # the program is Triton's OpenAI frontend, which takes OPENAI_RESTRICTION_FLAG

    def argv(self) -> list[str]:
        if not self.apis or not self.supported:
            return []
        if self.openai:
            # nargs=3 takes no `=` form: the key is a word of its own, so it must not look like an option.
            return [OPENAI_RESTRICTION_FLAG, *value_words(",".join(self.apis), HEADER, self.key)]
        value = f"{','.join(self.apis)}:{HEADER}={self.key}"
        return [f"{flag}={value}" for flag in RESTRICTION_FLAGS]


def restriction(settings: Settings, facts: ImageFacts) -> Restriction:
    """tritonserver's: with FRONTEND=openai no tritonserver runs (openai_restriction is the frontend's)."""
    return Restriction(
        apis=settings.restricted_apis,
        key=settings.admin_key,
        supported=settings.frontend == "triton" and "restricted_apis" in facts.features,
    )


def openai_restriction(settings: Settings, facts: ImageFacts) -> Restriction:
    """The OpenAI frontend's routes that RESTRICTED_APIS closes, where this image's frontend takes the flag
    (capability `openai_restricted_api`), with the same admin key."""
    defined = [f.removeprefix(OPENAI_GROUP_FEATURE) for f in facts.features if f.startswith(OPENAI_GROUP_FEATURE)]
    order = {api: i for i, api in enumerate(settings.restricted_apis)}
    closed = [g for g in defined if settings.restricted_apis and (g not in OPENAI_GROUPS or OPENAI_GROUPS[g] in order)]
    # In RESTRICTED_APIS' order; groups we do not know last.
    apis = tuple(sorted(closed, key=lambda g: order.get(OPENAI_GROUPS.get(g) or "", len(order))))
    return Restriction(
        apis=apis,
        key=settings.admin_key,
        supported=settings.frontend == "openai" and "openai_restricted_api" in facts.features,
        openai=True,
    )


def start_warnings(settings: Settings, facts: ImageFacts) -> list[str]:
    """What stays open at this start, for the start-up log."""
    if settings.frontend == "triton" and restriction_flags(settings.triton_args):
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
        if not openai_restriction(settings, facts).supported:
            first = facts.first_tag_with.get("openai_restricted_api", "a later image")
            return [
                f"FRONTEND=openai: the OpenAI frontend of image {facts.tag} cannot restrict its routes "
                f"(--openai-restricted-api comes with {first}); /v1/models and /metrics are open to any client"
            ]
        return []
    if "restricted_apis" not in facts.features:
        return [f"tritonserver {facts.triton} in image {facts.tag} cannot restrict APIs; {what} stay open"]
    return []
