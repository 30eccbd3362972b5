"""The server arguments the entrypoint sets itself, and the check that extra arguments (TRITON_ARGS) do not set them
again: a second `--http-port` would make the health check probe the wrong port, a second `--model-repository` would
serve a repository nobody checked. Pure, so any source of extra arguments can use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtllm_entrypoint.errors import UsageError

REPOSITORY_FLAGS = ("--model-repository", "--model-store")
# Restrict Triton's APIs to clients with the admin key (see security.py; Triton >= 2.40).
RESTRICTION_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")
OPENAI_RESTRICTION_FLAG = "--openai-restricted-api"  # Triton's OpenAI frontend, server r25.09 on
PORT_FLAGS = {"--http-port": "http_port", "--grpc-port": "grpc_port", "--metrics-port": "metrics_port"}
# Flag -> the variable meant for it. The OpenAI frontend (FRONTEND=openai) has its own names for the ports.
RESERVED = {
    **dict.fromkeys(REPOSITORY_FLAGS, "REPOSITORY_DIR (or MODEL_ID naming a complete model repository)"),
    **{flag: field.upper() for flag, field in PORT_FLAGS.items()},
    "--openai-port": "OPENAI_PORT",
    "--kserve-http-port": "HTTP_PORT",
    "--kserve-grpc-port": "GRPC_PORT",
    # A second restriction group for an API even stops Triton; an empty one would silently open it.
    **dict.fromkeys(
        (*RESTRICTION_FLAGS, OPENAI_RESTRICTION_FLAG),
        "RESTRICTED_APIS (and the key with TRITON_ADMIN_KEY or TRITON_ADMIN_KEY_FILE)",
    ),
    # The OpenAI frontend's KServe frontends cannot restrict APIs: only the variable, checked against RESTRICTED_APIS.
    "--enable-kserve-frontends": "OPENAI_KSERVE_FRONTENDS=true (with RESTRICTED_APIS=none: they cannot restrict APIs)",
}
BACKEND_CONFIG = "--backend-config"
SHM_PREFIX = "python,shm-region-prefix-name"
MIN_ABBREVIATION = 6  # getopt_long (tritonserver) and argparse (the OpenAI frontend) accept unique prefixes


def restriction_flags(args: Sequence[str]) -> list[str]:
    """The API restriction flags a command line sets itself."""
    return [flag for flag in (arg.split("=", 1)[0] for arg in args) if flag in RESTRICTION_FLAGS]


def _reserved_flag(name: str) -> str | None:
    for flag in RESERVED:
        if name == flag or (len(name) >= MIN_ABBREVIATION and flag.startswith(name)):
            return flag
    return None


def reserved_argument(args: Sequence[str]) -> tuple[str, str] | None:
    """(the argument, the variable meant for it) for the first argument that sets what we set, else None."""
    for i, arg in enumerate(args):
        name, sep, value = arg.partition("=")
        if not name.startswith("--"):
            continue
        flag = _reserved_flag(name)
        if flag is not None:
            return arg, RESERVED[flag]
        if name == BACKEND_CONFIG:
            value = value if sep else (args[i + 1] if i + 1 < len(args) else "")
            if value.startswith(SHM_PREFIX):
                return arg, "nothing: each rank gets its own shared-memory prefix from the entrypoint"
    return None


def check_extra_arguments(args: Sequence[str], source: str = "TRITON_ARGS") -> None:
    found = reserved_argument(args)
    if found is not None:
        arg, variable = found
        raise UsageError(f"{source} may not contain {arg!r}: the entrypoint sets it itself", f"set {variable} instead")
