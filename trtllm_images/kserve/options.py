"""The options of `build.py kserve`: `KServeOptions`, and `OPTIONS`, the table that declares each flag once (its help;
its type and default are the field's). cli.py turns the table into click options; kserve.py turns options back into
the command line stamped into generated files. Bad options are refused when made (kserve_checks.py), as one
UsageError naming the flags, before any manifest is rendered or written."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import UnionType
from typing import cast, get_args, get_origin, get_type_hints

from trtllm_entrypoint.errors import UsageError
from trtllm_images.kserve.checks import ACCESS_MODES, CACHE_MODES, FRONTENDS, problems_of
from trtllm_images.kserve.fields import KServeFields


@dataclass(frozen=True)
class KServeOptions(KServeFields):
    """The options, refused when made if any is bad (every problem named at once)."""

    def __post_init__(self) -> None:
        problems = problems_of(self)
        if problems:
            raise UsageError(
                "invalid KServe options: " + "; ".join(problems),
                "see `python build.py kserve --help` and docs/kserve.md",
            )


@dataclass(frozen=True)
class Option:
    """One flag of `build.py kserve` and the KServeOptions field it sets. What it takes (text, a number, a switch, a
    repeatable text) and its default are the field's: a field without a default is required, and a switch flips the
    field's default (--storage-writable sets storage_readonly False)."""

    field: str
    help: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    flag: str = ""  # default: "--" + the field's name with dashes
    clears: bool = False  # a switch that sets the field to None (--no-hf-token), beside the flag that sets it
    follows: str | None = None  # left out, the field takes this other field's value (--max-replicas: --min-replicas)

    @property
    def name(self) -> str:
        """The flag as a user types it."""
        return self.flag or "--" + self.field.replace("_", "-")

    @property
    def keyword(self) -> str:
        """The keyword the command line hands the value over as (from_flags reads it)."""
        return self.name[2:].replace("-", "_") if self.clears else self.field

    @property
    def kind(self) -> type:
        """str, int, float, bool (a switch) or tuple (repeatable, of str): from the field's type."""
        if self.clears:
            return bool
        hint = get_type_hints(KServeOptions)[self.field]
        if isinstance(hint, UnionType):  # X | None
            (hint,) = (arg for arg in get_args(hint) if arg is not type(None))
        return cast(type, get_origin(hint) or hint)

    @property
    def required(self) -> bool:
        return _field(self.field).default is dataclasses.MISSING

    @property
    def default(self) -> object:
        """The value a command line without this flag gives: the field's default (None: required or derived)."""
        if self.clears or self.follows or self.required:
            return None
        return _field(self.field).default


# Every flag of `build.py kserve`, in the order `--help` lists them.
OPTIONS = (
    Option("tag", "The NGC tag whose server image the runtime runs, e.g. 25.01."),
    Option("image", "Full image ref (default: the server image build.py makes for --tag)."),
    Option("registry", "Prefix of the default image ref, e.g. ghcr.io/my-org.", metavar="HOST[/NAMESPACE]"),
    Option("model_id", "Hugging Face model id the pod downloads (or give --storage-uri)."),
    Option("model_revision", "Pin the hub model to a revision."),
    Option("storage_uri", "KServe puts the model at /mnt/models: s3://, gs://, pvc://, hf://, …"),
    Option(
        "adapters",
        "LoRA adapters (docs/lora.md): a claim of PEFT adapters, one per subdirectory, mounted read-only at "
        "/mnt/adapters as LORA_DIR (tags from 25.05; the engine workflow).",
        metavar="pvc://CLAIM[/PATH]",
    ),
    Option("tp_size", "Tensor parallelism."),
    Option("pp_size", "Pipeline parallelism (GPUs = TP x PP)."),
    Option("namespace"),
    Option("name", "InferenceService name, also the served model name."),
    Option(
        "cache",
        "Where engines are cached: per pod (emptydir) or on a PersistentVolumeClaim (pvc).",
        choices=CACHE_MODES,
    ),
    Option("pvc_name", "Cache PVC name  [default: <name>-trtllm-cache]"),
    Option("pvc_size"),
    Option(
        "pvc_access_mode",
        "ReadWriteMany whenever several pods mount the cache (replicas, a group's pods, the warm Job).",
        choices=ACCESS_MODES,
    ),
    Option("pvc_storage_class", "The cache PVC's StorageClass (one that provides the access mode)."),
    Option("namespaced_runtime", "A ServingRuntime in --namespace, not a ClusterServingRuntime."),
    Option("warm_job", "Add a Job that builds the engine into the cache PVC (needs --cache pvc)."),
    Option("hf_token_secret", "Secret holding the Hugging Face token under key 'token' (optional at run time)."),
    Option("hf_token_secret", "Reference no token Secret.", flag="--no-hf-token", clears=True),
    Option(
        "admin_key_secret",
        "Secret holding the key of Triton's restricted APIs under key 'key' (optional at run time; "
        "without it those APIs stay closed).",
    ),
    Option("admin_key_secret", "Reference no admin-key Secret.", flag="--no-admin-key", clears=True),
    Option("storage_readonly", "Mount /mnt/models read-write (default: read-only).", flag="--storage-writable"),
    Option(
        "frontend",
        "openai: Triton's OpenAI-compatible frontend on the HTTP port, probed at /health/ready (tags from 24.12).",
        choices=FRONTENDS,
    ),
    Option("min_replicas", "Replicas (groups with --nodes) at least."),
    Option(
        "max_replicas",
        "Replicas at most; above --min-replicas: autoscaling with KEDA on Triton's queue/compute ratio and a "
        "PodMonitor (needs KEDA and the Prometheus Operator)  [default: --min-replicas, a fixed count]",
        follows="min_replicas",
    ),
    Option("scale_target", "Scale out while Triton's queue time exceeds this multiple of its compute time."),
    Option("scale_down_window", "Seconds of lower load before scaling in."),
    Option("prometheus_url", "The Prometheus the autoscaler queries."),
    Option("nodes", "Pods (nodes) per model replica; above 1: a LeaderWorkerSet group instead of an InferenceService."),
    Option("ssh_secret", "Secret with the group's MPI ssh key  [default: <name>-mpi-ssh]"),
    Option("node_selector", "Node label every pod needs (repeatable).", metavar="KEY=VALUE"),
    Option(
        "tolerations",
        "A taint every pod tolerates, e.g. nvidia.com/gpu:NoSchedule (repeatable).",
        metavar="KEY[=VALUE][:EFFECT]",
        flag="--toleration",
    ),
    Option("affinity", "A Kubernetes Affinity object for every pod, as JSON.", metavar="JSON"),
    Option("image_pull_secrets", "Pull secret (repeatable).", metavar="NAME", flag="--image-pull-secret"),
    Option("service_account", "Service account of every pod.", metavar="NAME"),
    Option("priority_class", "PriorityClass of every pod.", metavar="NAME"),
    Option("env", "Extra environment of every pod, e.g. MAX_BATCH_SIZE=64.", metavar="NAME=VALUE"),
    Option("cpu", "CPU request of each serving pod."),
    Option("memory", "Memory request of each serving pod."),
    Option("cpu_limit", "CPU limit  [default: none, a limit throttles tokenization]"),
    Option("memory_limit", "Memory limit  [default: --memory]"),
)
_SETS = {option.field: option for option in OPTIONS if not option.clears}  # the flag that sets each field
_CLEARS = {option.field: option for option in OPTIONS if option.clears}


def _field(name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(KServeOptions) if f.name == name)


def flag(field: str) -> str:
    """The command-line flag of a KServeOptions field."""
    return _SETS[field].name


def from_flags(values: Mapping[str, object]) -> KServeOptions:
    """KServeOptions from what `build.py kserve` received, by each option's keyword (a flag left out: its default)."""
    fields: dict[str, object] = {}
    for option in _SETS.values():
        value = values[option.keyword]
        if option.kind is bool:
            value = bool(value) != _field(option.field).default  # a switch flips the default
        elif value is None and option.follows:
            value = values[option.follows]
        fields[option.field] = value
    fields.update({option.field: None for option in _CLEARS.values() if values[option.keyword]})
    return KServeOptions(**fields)  # type: ignore[arg-type]


def to_flags(options: KServeOptions) -> list[str]:
    """The flags that give these options, field by field (none for a default): from_flags' inverse."""
    argv: list[str] = []
    for field in dataclasses.fields(KServeOptions):
        value = getattr(options, field.name)
        if value == field.default:
            continue
        if value is None:
            argv.append(_CLEARS[field.name].name)
        elif isinstance(value, bool):
            argv.append(flag(field.name))
        elif isinstance(value, tuple):  # a repeatable option
            argv += [part for item in value for part in (flag(field.name), item)]
        else:
            argv += [flag(field.name), str(value)]
    return argv
