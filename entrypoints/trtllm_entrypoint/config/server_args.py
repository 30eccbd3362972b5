"""The one table of the server programs' flags, and the one parser of their command lines.

Every user of a server command line goes through `parse`: the check that `TRITON_ARGS` and dash arguments do not set
what the entrypoint sets (a second `--http-port` would make the health check probe the wrong port, a second
`--model-repository` would serve a repository nobody checked), reading a typed `tritonserver …` command, and
replacing its repository. `parse` follows getopt_long, which tritonserver uses (measured on 2.51): any unique prefix
of a long option is that option (`--model-repo=/x` serves /x), an ambiguous prefix is refused, a flag that takes a
value takes the next argument whatever it looks like (`--log-file --model-store=/x` names a log file), and a flag
without one refuses `=value`. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trtllm_entrypoint.errors import UsageError

REPOSITORY = "REPOSITORY_DIR (or MODEL_ID naming a complete model repository)"
RESTRICTION = "RESTRICTED_APIS (and the key with TRITON_ADMIN_KEY or TRITON_ADMIN_KEY_FILE)"
HTTP_RESTRICTION = "--http-restricted-api"
GRPC_RESTRICTION = "--grpc-restricted-protocol"
RESTRICTION_FLAGS = (HTTP_RESTRICTION, GRPC_RESTRICTION)
BACKEND_CONFIG = "--backend-config"
REPOSITORY_FLAG = "--model-repository"  # --model-store is the same option
SHM_PREFIX = "python,shm-region-prefix-name"
FALSE_WORDS = ("false", "off", "0")  # tritonserver's booleans (2.51 ParseOption<bool>), compared lower-cased


@dataclass(frozen=True)
class Flag:
    name: str  # "--http-port"
    value: bool = True  # takes a value (getopt's required_argument); False: it takes none
    owner: str | None = None  # reserved: the variable that sets it instead (refused in TRITON_ARGS)
    field: str | None = None  # the Settings field its value fills (the ports)
    same_as: str | None = None  # another name of the same option (getopt counts them as one when prefixes clash)
    # A side door: it opens a route to the restricted APIs that the restriction flags do not close. Refused
    # whenever the server restricts any API; the value is the capabilities.yaml feature that records the
    # Triton versions having it.
    side_door: str | None = None

    @property
    def option(self) -> str:
        return self.same_as or self.name


def _flags(*names: str) -> tuple[Flag, ...]:
    return tuple(Flag(name) for name in names)


# tritonserver 2.51.0's options, as its --help lists them (tests/real/test_real_triton_flags.py compares).
TRITONSERVER = (
    Flag("--help", value=False),
    *_flags("--id", "--exit-timeout-secs", "--log-verbose", "--log-info", "--log-warning", "--log-error"),
    *_flags("--log-format", "--log-file"),
    Flag("--model-store", owner=REPOSITORY, same_as="--model-repository"),
    Flag("--model-repository", owner=REPOSITORY),
    Flag("--exit-on-error"),
    Flag("--disable-auto-complete-config", value=False),
    *_flags("--strict-readiness", "--model-control-mode", "--repository-poll-secs", "--load-model"),
    *_flags("--model-config-name", "--model-load-thread-count", "--model-load-retry-count", "--model-namespacing"),
    *_flags("--enable-peer-access", "--allow-http", "--http-address"),
    Flag("--http-port", owner="HTTP_PORT", field="http_port"),
    *_flags("--reuse-http-port", "--http-header-forward-pattern", "--http-thread-count"),
    Flag(HTTP_RESTRICTION, owner=RESTRICTION),
    *_flags("--allow-grpc", "--grpc-address"),
    Flag("--grpc-port", owner="GRPC_PORT", field="grpc_port"),
    *_flags("--reuse-grpc-port", "--grpc-header-forward-pattern", "--grpc-infer-allocation-pool-size"),
    *_flags("--grpc-use-ssl", "--grpc-use-ssl-mutual", "--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert"),
    *_flags("--grpc-infer-response-compression-level", "--grpc-keepalive-time", "--grpc-keepalive-timeout"),
    *_flags("--grpc-keepalive-permit-without-calls", "--grpc-http2-max-pings-without-data"),
    *_flags("--grpc-http2-min-recv-ping-interval-without-data", "--grpc-http2-max-ping-strikes"),
    *_flags("--grpc-max-connection-age", "--grpc-max-connection-age-grace"),
    Flag(GRPC_RESTRICTION, owner=RESTRICTION),
    # SageMaker's `POST /models {"url": …}` loads a model from any path: the model-repository API without the key.
    Flag("--allow-sagemaker", side_door="tritonserver_sagemaker"),
    *_flags("--sagemaker-port", "--sagemaker-safe-port-range", "--sagemaker-thread-count"),
    # Vertex AI forwards any request to the route its `X-Vertex-Ai-Triton-Redirect` header names, without the key.
    Flag("--allow-vertex-ai", side_door="tritonserver_vertex_ai"),
    *_flags("--vertex-ai-port", "--vertex-ai-thread-count", "--vertex-ai-default-model"),
    *_flags("--allow-metrics", "--allow-gpu-metrics", "--allow-cpu-metrics", "--metrics-address"),
    Flag("--metrics-port", owner="METRICS_PORT", field="metrics_port"),
    *_flags("--metrics-interval-ms", "--metrics-config", "--trace-config", "--backend-directory", BACKEND_CONFIG),
    *_flags("--repoagent-directory", "--cache-config", "--cache-directory", "--rate-limit", "--rate-limit-resource"),
    *_flags("--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size", "--cuda-virtual-address-size"),
    *_flags("--min-supported-compute-capability", "--buffer-manager-thread-count", "--host-policy"),
    *_flags("--model-load-gpu-limit", "--strict-model-config", "--response-cache-byte-size", "--trace-file"),
    *_flags("--trace-level", "--trace-rate", "--trace-count", "--trace-log-frequency"),
)
# Variables that open a side door in the server's environment: (variable, value, how to keep it closed, feature).
# tritonserver turns Vertex AI on by itself when AIP_MODE=PREDICTION (its --help: "Default is true if
# AIP_MODE=PREDICTION"; measured on 2.51: it starts the service).
SIDE_DOOR_VARIABLES = (("AIP_MODE", "PREDICTION", "--allow-vertex-ai=false", "tritonserver_vertex_ai"),)


@dataclass(frozen=True)
class Option:
    """One argument of a command line as the program reads it."""

    given: str  # the name as typed ("--model-repo"), or the argument itself when it is not an option
    flag: Flag | None  # None: a positional argument, or an option the table does not know
    value: str | None = None
    index: int = 0  # where `given` is in the arguments
    value_index: int | None = None  # where the value is: `index` (--flag=value), `index + 1`, or None

    def indexes(self) -> tuple[int, ...]:
        return (self.index,) if self.value_index in (None, self.index) else (self.index, self.index + 1)


def resolve(name: str, table: Sequence[Flag]) -> Flag | None:
    """The flag `name` (`--` and a unique prefix, or the exact name) stands for; None when it names none.
    UsageError when the prefix fits several options, as getopt_long and argparse refuse it."""
    exact = [flag for flag in table if flag.name == name]
    if exact:
        return exact[0]
    if len(name) <= 2:
        return None
    found = [flag for flag in table if flag.name.startswith(name)]
    options = {flag.option for flag in found}
    if len(options) > 1:
        raise UsageError(
            f"the server option {name!r} is ambiguous: it could be " + ", ".join(sorted(flag.name for flag in found)),
            "write the option out in full",
        )
    return found[0] if found else None


def parse_options(args: Sequence[str], table: Sequence[Flag] = TRITONSERVER) -> list[Option]:
    """Each argument as the program reads it (the program itself is not in `args`)."""
    options: list[Option] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":  # the rest are positional arguments
            options += [Option(rest, None, index=i + 1 + k) for k, rest in enumerate(args[i + 1 :])]
            break
        name, sep, value = arg.partition("=")
        flag = resolve(name, table) if arg.startswith("--") else None
        if flag is None:
            options.append(Option(arg, None, index=i))
        elif not flag.value:
            if sep:
                raise UsageError(f"the server option {flag.name} takes no value, got {arg!r}")
            options.append(Option(name, flag, index=i))
        elif sep:
            options.append(Option(name, flag, value, index=i, value_index=i))
        elif i + 1 < len(args):
            options.append(Option(name, flag, args[i + 1], index=i, value_index=i + 1))
            i += 1
        else:
            raise UsageError(f"the server option {flag.name} needs a value", f"write {flag.name}=VALUE")
        i += 1
    return options


def found(options: Sequence[Option], *names: str) -> list[Option]:
    """The options that are one of the flags `names`, however they were spelled."""
    return [option for option in options if option.flag is not None and option.flag.option in names]


def restriction_flags(args: Sequence[str]) -> list[str]:
    """The API restriction flags a tritonserver command line sets itself, however they are spelled."""
    return [option.given for option in found(parse_options(args), *RESTRICTION_FLAGS)]


def reserved_argument(args: Sequence[str], table: Sequence[Flag] = TRITONSERVER) -> tuple[str, str] | None:
    """(the option as given, the variable meant for it) for the first option that sets what we set, else None."""
    for option in parse_options(args, table):
        if option.flag is None:
            continue
        if option.flag.owner is not None:
            shown = repr(option.given) + ("" if option.given == option.flag.name else f" ({option.flag.name})")
            return shown, option.flag.owner
        if option.flag.name == BACKEND_CONFIG and (option.value or "").startswith(SHM_PREFIX):
            return repr(option.given), "nothing: each rank gets its own shared-memory prefix from the entrypoint"
    return None


def check_extra_arguments(args: Sequence[str], source: str = "TRITON_ARGS") -> None:
    found_arg = reserved_argument(args)
    if found_arg is not None:
        arg, variable = found_arg
        # The option's name only: the value of a restriction flag holds a key.
        raise UsageError(f"{source} may not contain {arg}: the entrypoint sets it itself", f"set {variable} instead")


def side_doors(args: Sequence[str], variables: Mapping[str, str]) -> list[str]:
    """What in these arguments, or in `variables` (the server's values of SIDE_DOOR_VARIABLES), opens a route
    around the API restriction."""
    options = parse_options(args)
    doors = []
    for option in options:
        if option.flag is None or option.flag.side_door is None:
            continue
        if option.flag.value and (option.value or "").strip().lower() in FALSE_WORDS:
            continue  # --allow-sagemaker=false keeps it closed
        doors.append(option.given if option.value is None else f"{option.given}={option.value}")
    for variable, value, closed_by, _feature in SIDE_DOOR_VARIABLES:
        name, _, flag_value = closed_by.partition("=")
        closed = any(o.flag is not None and o.flag.name == name and o.value == flag_value for o in options)
        if variables.get(variable, "").strip() == value and not closed:
            doors.append(f"{variable}={value} in the environment (without {closed_by})")
    return doors


def check_side_doors(args: Sequence[str], variables: Mapping[str, str], source: str) -> None:
    doors = side_doors(args, variables)
    if doors:
        raise UsageError(
            f"{source} opens a route around the API restriction: {', '.join(doors)} (SageMaker and Vertex AI "
            "answer restricted APIs without the key)",
            "remove it, or set RESTRICTED_APIS=none to open every API on purpose",
        )


def restriction_values(options: Sequence[Option]) -> dict[str, list[str]]:
    """The restriction groups a command line sets itself: flag -> values (`<apis>:<header>=<key>`)."""
    return {flag: [o.value or "" for o in found(options, flag)] for flag in RESTRICTION_FLAGS}


def restriction_keys(values: dict[str, list[str]]) -> list[str]:
    """The keys in restriction values, for masking: whatever follows the first `=` of each group."""
    return [value.partition("=")[2] for group in values.values() for value in group if value.partition("=")[2]]


def completed_restriction(options: Sequence[Option]) -> list[str]:
    """The flags that restrict the protocol a command line left open, with the same groups and keys as the one it
    restricts: `--http-restricted-api` alone leaves gRPC open otherwise (Triton prefixes gRPC headers itself)."""
    values = restriction_values(options)
    http, grpc = values[HTTP_RESTRICTION], values[GRPC_RESTRICTION]
    if bool(http) == bool(grpc):
        return []
    missing, given = (GRPC_RESTRICTION, http) if http else (HTTP_RESTRICTION, grpc)
    return [f"{missing}={value}" for value in given]
