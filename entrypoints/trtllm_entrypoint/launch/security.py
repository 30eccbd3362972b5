"""Which of Triton's APIs stay closed to clients without the admin key, and the tritonserver flags that close them.

Triton checks one header per restricted API: `admin-key` over HTTP, `triton-grpc-protocol-admin-key` over gRPC
(it prefixes gRPC keys itself). Measured on 2.51: the flag value is `<apis>:<header>=<value>` (the help text's
`<apis>,<header>=<value>` is refused), restricted routes answer 403 over HTTP and UNAVAILABLE over gRPC without the
header, and a value may hold any visible ASCII. Without TRITON_ADMIN_KEY the key is random per start and never
shown, so the restricted APIs are unreachable (Triton refuses an empty value).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.config.server_args import RESTRICTION_FLAGS, restriction_flags
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.openai.plan import FrontPlan

HEADER = contract.ADMIN_KEY_HEADER
# The OpenAI front's routes and the RESTRICTED_APIS group that closes each: what /v1/models tells is what Triton's
# model metadata tells; inference is inference. Health stays open, as Triton's; Triton's metrics port serves metrics.
FRONT_APIS = ("inference", "metadata")


@dataclass(frozen=True)
class Restriction:
    """What this start closes: a value to print and test; `argv()` holds the key, so never log it unmasked."""

    apis: tuple[str, ...]
    key: str = field(repr=False)
    supported: bool  # tritonserver has the flags (capability `restricted_apis`)

    def argv(self) -> list[str]:
        if not self.apis or not self.supported:
            return []
        value = f"{','.join(self.apis)}:{HEADER}={self.key}"
        return [f"{flag}={value}" for flag in RESTRICTION_FLAGS]


def restriction(settings: Settings, facts: ImageFacts) -> Restriction:
    return Restriction(
        apis=settings.restricted_apis, key=settings.admin_key, supported="restricted_apis" in facts.features
    )


def front_restricted(settings: Settings) -> tuple[str, ...]:
    """The OpenAI front's route groups that RESTRICTED_APIS closes (the front then wants the admin key)."""
    return tuple(api for api in FRONT_APIS if api in settings.restricted_apis)


def start_warnings(settings: Settings, facts: ImageFacts, front: FrontPlan | None = None) -> list[str]:
    """What stays open at this start, for the start-up log; `front`: the OpenAI front the plan runs, if any."""
    if front is None and restriction_flags(settings.triton_args):
        return []  # a `tritonserver …` command line of the user's own that restricts APIs itself
    if not settings.restricted_apis:
        return [
            "RESTRICTED_APIS=none: every Triton API (shared memory, model repository, logging, trace, "
            "statistics) is open to any client that reaches the ports"
        ]
    what = ", ".join(settings.restricted_apis)
    if "restricted_apis" not in facts.features:
        return [f"tritonserver {facts.triton} in image {facts.tag} cannot restrict APIs; {what} stay open"]
    return []
