"""The options of `build.py kserve` and their validation: everything the entrypoint or KServe would refuse later is
refused here, as one UsageError, before any manifest is rendered or written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

from trtllm_entrypoint import contract
from trtllm_entrypoint.contract import HUB_ID_RULE, is_hub_id
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.variables import VARIABLES

CACHE_MODES = ("emptydir", "pvc")
FRONTENDS = ("triton", "openai")  # the entrypoint's FRONTEND values
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany")
INT32_MAX = 2**31 - 1  # replica counts and sizes are int32 in the Kubernetes API
HPA_MAX_WINDOW = 3600  # autoscaling/v2 stabilizationWindowSeconds: 0 to 3600
# What the entrypoint reads from an environment variable: printable ASCII, no spaces (it strips and splits nothing).
_PLAIN = re.compile(r"[!-~]+")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # KServe's rule for InferenceService names
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
# An image reference by the distribution grammar: [host[:port]/]path[:tag][@digest], path components lowercase.
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"^(?:{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
# The names of the models a filled repository holds besides the served one (whatever the workflow).
RESERVED_NAMES = frozenset(name for names in contract.INNER_MODELS.values() for name in names)


@dataclass(frozen=True)
class KServeOptions:
    tag: str
    image: str | None = None  # full image ref; default: the server image build.py makes for the tag
    registry: str | None = None  # prefix for the default image ref
    model_id: str | None = None  # hub id; None -> the model that storage_uri puts at /mnt/models
    model_revision: str | None = None
    storage_uri: str | None = None
    tp_size: int = cast(int, VARIABLES["TP_SIZE"].default)
    pp_size: int = cast(int, VARIABLES["PP_SIZE"].default)
    namespace: str = "default"
    name: str = "llm"
    cache: str = "emptydir"  # "emptydir" | "pvc"
    pvc_name: str | None = None  # default "<name>-trtllm-cache"
    pvc_size: str = "100Gi"
    pvc_access_mode: str = "ReadWriteOnce"
    namespaced_runtime: bool = False
    warm_job: bool = False
    hf_token_secret: str | None = "hf-token"  # Secret with key "token"; optional, so public models need none
    # Secret with key "key"; optional: without it the restricted Triton APIs stay closed to everyone.
    admin_key_secret: str | None = "triton-admin-key"
    storage_readonly: bool = True  # the entrypoint never writes below /mnt/models
    # Autoscaling on Triton's queue/compute ratio (scaling.py); min == max renders a fixed replica count.
    min_replicas: int = 1
    max_replicas: int = 4
    scale_target: float = 1.0  # time queued per time computed, averaged over the replicas
    scale_down_window: int = 600  # seconds of lower load before replicas go: a cold start costs minutes
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"  # the Prometheus Operator's Service
    # Multi-node: one model replica spans `nodes` pods of a LeaderWorkerSet, TP x PP / nodes GPUs each.
    nodes: int = 1
    ssh_secret: str | None = None  # default "<name>-mpi-ssh": the MPI launcher's key (docs/kserve.md)
    frontend: str = "triton"  # "openai": Triton's OpenAI frontend on the HTTP port (tags with it, matrix entry)

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise UsageError(
                "invalid KServe options: " + "; ".join(problems),
                "see `python build.py kserve --help` and docs/kserve.md",
            )

    @property
    def gpus(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def claim(self) -> str:
        return self.pvc_name or f"{self.name}-trtllm-cache"

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.min_replicas

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def ssh_secret_name(self) -> str:
        return self.ssh_secret or f"{self.name}-mpi-ssh"


def _problems(o: KServeOptions) -> list[str]:
    problems = []
    for label, value in (
        ("name", o.name),
        ("namespace", o.namespace),
        ("pvc name", o.claim),
        ("hf token secret", o.hf_token_secret or "x"),
        ("admin key secret", o.admin_key_secret or "x"),
    ):
        if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
            problems.append(f"{label} {value!r} must be a DNS label (lowercase letters, digits, '-', at most 63)")
    if len(o.name) > 45:  # KServe and the warm Job append suffixes such as "-predictor" to it
        problems.append(f"name {o.name!r} is longer than 45 characters")
    if o.name in RESERVED_NAMES:  # the served model takes the service's name
        problems.append(f"name {o.name!r} clashes with a model inside the Triton repository")
    if (o.model_id is None) == (o.storage_uri is None):
        problems.append("give exactly one of model_id (a hub id) and storage_uri (KServe puts it at /mnt/models)")
    if o.model_id is not None and not (isinstance(o.model_id, str) and is_hub_id(o.model_id)):
        problems.append(f"model_id {o.model_id!r} is not allowed: the entrypoint takes {HUB_ID_RULE}")
    for label, text in (("model_revision", o.model_revision), ("storage_uri", o.storage_uri)):
        if text is not None and not (isinstance(text, str) and _PLAIN.fullmatch(text) and "${" not in text):
            problems.append(f"{label} {text!r} must be printable ASCII without spaces or '${{'")
    if o.storage_uri is not None and "://" not in o.storage_uri:
        problems.append(f"storage_uri {o.storage_uri!r} needs a scheme such as hf://, s3://, gs://, pvc://")
    problems += _parallelism_problems(o)
    if not _DNS_1035_LABEL.fullmatch(o.name):
        problems.append(f"name {o.name!r} must start with a lowercase letter (KServe's rule for service names)")
    problems += _storage_problems(o.storage_uri)
    for label, ref in (("image", o.image), ("registry", o.registry and f"{o.registry}/trtllm-serve:x")):
        if ref and not _IMAGE_REF.fullmatch(ref):
            problems.append(f"{label} {getattr(o, label)!r} is not an image reference such as ghcr.io/org/name:tag")
    if o.frontend not in FRONTENDS:
        problems.append(f"frontend {o.frontend!r} is not one of {', '.join(FRONTENDS)}")
    if o.frontend == "openai" and o.max_replicas > o.min_replicas:
        problems.append(
            "frontend 'openai' serves a fixed replica count: autoscaling reads Triton's metrics port, which the "
            "OpenAI mode does not serve (give --max-replicas equal to --min-replicas)"
        )
    if o.frontend == "openai" and o.nodes > 1:
        problems.append("frontend 'openai' runs on one node: Triton's OpenAI frontend does not span pods")
    if o.cache not in CACHE_MODES:
        problems.append(f"cache {o.cache!r} is not one of {', '.join(CACHE_MODES)}")
    if o.pvc_access_mode not in ACCESS_MODES:
        problems.append(f"pvc_access_mode {o.pvc_access_mode!r} is not one of {', '.join(ACCESS_MODES)}")
    if not _QUANTITY.fullmatch(o.pvc_size) or float(re.sub(r"[A-Za-z]+$", "", o.pvc_size) or 0) == 0:
        problems.append(f"pvc_size {o.pvc_size!r} is not a Kubernetes quantity above zero such as 100Gi")
    problems += _scaling_problems(o)
    if o.image and o.registry:
        problems.append("image and registry exclude each other (registry only prefixes the default image)")
    if o.warm_job and o.cache != "pvc":
        problems.append("warm_job needs cache='pvc': an emptyDir dies with the Job's pod")
    if o.warm_job and o.storage_uri and not o.storage_uri.startswith("pvc://"):
        problems.append(
            "warm_job can only read a model given as a hub id or a pvc:// storage_uri "
            "(the storage initializer runs for InferenceServices only)"
        )
    return problems


def _parallelism_problems(o: KServeOptions) -> list[str]:
    """TP_SIZE and PP_SIZE as the entrypoint reads them (its variable table), so no pod exits 2 at start."""
    problems = []
    for label, size in (("tp_size", o.tp_size), ("pp_size", o.pp_size)):
        variable = VARIABLES[label.upper()]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append(f"{label} must be a positive integer, got {size!r}")
        elif variable.choices and size not in variable.choices:
            problems.append(f"{label} must be {variable.allowed_text.replace('`', '')}, got {size}")
        elif variable.high is not None and size > variable.high:
            problems.append(f"{label} must be at most {variable.high}, got {size}")
    return problems


def _storage_problems(uri: str | None) -> list[str]:
    """A pvc:// URI names a claim (a DNS subdomain) and a path inside it that stays inside it."""
    if uri is None or not uri.startswith("pvc://"):
        return []
    claim, _, path = uri[len("pvc://") :].partition("/")
    problems = []
    if len(claim) > 253 or not _DNS_SUBDOMAIN.fullmatch(claim):
        problems.append(f"storage_uri {uri!r} must name a PersistentVolumeClaim: pvc://<claim>[/<path>]")
    if any(part in (".", "..") for part in path.split("/")):
        problems.append(f"storage_uri {uri!r} may not leave the claim ('.' or '..' in the path)")
    return problems


def _scaling_problems(o: KServeOptions) -> list[str]:
    problems = []
    counts = (("min_replicas", o.min_replicas, 1), ("max_replicas", o.max_replicas, 1), ("nodes", o.nodes, 1))
    for label, value, least, most in (
        *((label, value, least, INT32_MAX) for label, value, least in counts),
        ("scale_down_window", o.scale_down_window, 0, HPA_MAX_WINDOW),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            problems.append(f"{label} must be an integer of at least {least} and at most {most}, got {value!r}")
    if isinstance(o.min_replicas, int) and isinstance(o.max_replicas, int) and o.max_replicas < o.min_replicas:
        problems.append(f"max_replicas {o.max_replicas} is below min_replicas {o.min_replicas}")
    if not isinstance(o.scale_target, (int, float)) or not 0.001 <= o.scale_target <= 1000:
        problems.append(f"scale_target must be a ratio from 0.001 to 1000, got {o.scale_target!r}")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", o.prometheus_url):
        problems.append(f"prometheus_url {o.prometheus_url!r} is not an http(s) URL")
    if o.ssh_secret is not None and (len(o.ssh_secret) > 63 or not _DNS_LABEL.fullmatch(o.ssh_secret)):
        problems.append(f"ssh secret {o.ssh_secret!r} must be a DNS label")
    if not isinstance(o.nodes, int) or o.nodes < 2 or not isinstance(o.tp_size, int) or not isinstance(o.pp_size, int):
        return problems
    if o.gpus % o.nodes:
        problems.append(
            f"TP x PP = {o.gpus} GPUs cannot be split evenly over {o.nodes} nodes: give a node count that divides it"
        )
    if o.storage_uri is not None:
        problems.append("a multi-node group reads its model by model_id (no KServe storage initializer runs)")
    if o.warm_job:
        problems.append("warm_job is for single-node services: every pod of a group prepares from the shared cache")
    if len(o.name) > 40:  # LWS names pods <name>-<group>-<worker>, and they must stay DNS labels
        problems.append(f"name {o.name!r} is longer than 40 characters, too long for a multi-node group")
    return problems
