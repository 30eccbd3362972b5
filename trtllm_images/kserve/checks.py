"""What `build.py kserve` refuses: everything the entrypoint or KServe would refuse later, checked on the options as a
whole before any manifest is rendered or written, and named by the flags a user types. (The values of the image's
own variables given with --env are the entrypoint's to check, at the pod's start, as with `docker run -e`.)"""

from __future__ import annotations

import json
import re
from typing import get_args

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.variables import VARIABLES, Frontend
from trtllm_entrypoint.contract import HUB_ID_RULE, is_hub_id
from trtllm_images.kserve.fields import KServeFields

CACHE_MODES = ("emptydir", "pvc")
FRONTENDS: tuple[str, ...] = get_args(Frontend)  # the entrypoint's FRONTEND values
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany")
INT32_MAX = 2**31 - 1  # replica counts and sizes are int32 in the Kubernetes API
HPA_MAX_WINDOW = 3600  # autoscaling/v2 stabilizationWindowSeconds: 0 to 3600
# What the entrypoint reads from an environment variable: printable ASCII, no spaces (it strips and splits nothing).
_PLAIN = re.compile(r"[!-~]+")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # KServe's rule for InferenceService names
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
_CPU = re.compile(r"^([0-9]+(\.[0-9]{1,3})?|[0-9]+m)$")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_UNITS.update({f"{p}i": 1024 ** (n + 1) for n, p in enumerate("KMGTP")})
# Label keys and values, as Kubernetes checks them: [prefix/]name, the name up to 63 characters.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_LIKE = re.compile(r"(TOKEN|SECRET|PASSWORD|KEY)", re.IGNORECASE)
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


def problems_of(o: KServeFields) -> list[str]:
    """Every reason to refuse these options, one line each, naming the flags (empty: they are fine)."""
    problems = []
    for label, value in (
        ("--name", o.name),
        ("--namespace", o.namespace),
        ("--pvc-name", o.claim),
        ("--hf-token-secret", o.hf_token_secret or "x"),
        ("--admin-key-secret", o.admin_key_secret or "x"),
    ):
        if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
            problems.append(f"{label} {value!r} must be a DNS label (lowercase letters, digits, '-', at most 63)")
    if len(o.name) > 45:  # KServe and the warm Job append suffixes such as "-predictor" to it
        problems.append(f"--name {o.name!r} is longer than 45 characters")
    if o.name in RESERVED_NAMES:  # the served model takes the service's name
        problems.append(f"--name {o.name!r} clashes with a model inside the Triton repository")
    if (o.model_id is None) == (o.storage_uri is None):
        problems.append("give exactly one of --model-id (a hub id) and --storage-uri (KServe puts it at /mnt/models)")
    if o.model_id is not None and not (isinstance(o.model_id, str) and is_hub_id(o.model_id)):
        problems.append(f"--model-id {o.model_id!r} is not allowed: the entrypoint takes {HUB_ID_RULE}")
    for label, text in (("--model-revision", o.model_revision), ("--storage-uri", o.storage_uri)):
        if text is not None and not (isinstance(text, str) and _PLAIN.fullmatch(text) and "${" not in text):
            problems.append(f"{label} {text!r} must be printable ASCII without spaces or '${{'")
    if o.storage_uri is not None and "://" not in o.storage_uri:
        problems.append(f"--storage-uri {o.storage_uri!r} needs a scheme such as hf://, s3://, gs://, pvc://")
    problems += _parallelism_problems(o)
    if not _DNS_1035_LABEL.fullmatch(o.name):
        problems.append(f"--name {o.name!r} must start with a lowercase letter (KServe's rule for service names)")
    problems += _storage_problems(o.storage_uri)
    if o.adapters is not None:
        if not o.adapters.startswith("pvc://"):
            problems.append(f"--adapters {o.adapters!r} must name a PersistentVolumeClaim: pvc://<claim>[/<path>]")
        problems += _storage_problems(o.adapters, "--adapters")
        if isinstance(o.nodes, int) and o.nodes > 1:
            problems.append("--adapters serves on one node (a multi-node group takes no --adapters)")
    for label, ref in (("image", o.image), ("registry", o.registry and f"{o.registry}/trtllm-serve:x")):
        if ref and not _IMAGE_REF.fullmatch(ref):
            problems.append(f"--{label} {getattr(o, label)!r} is not an image reference such as ghcr.io/org/name:tag")
    if o.frontend not in FRONTENDS:
        problems.append(f"--frontend {o.frontend!r} is not one of {', '.join(FRONTENDS)}")
    if o.frontend == "openai" and o.nodes > 1:
        problems.append("--frontend openai runs on one node: the OpenAI front does not span pods (drop --nodes)")
    if o.cache not in CACHE_MODES:
        problems.append(f"--cache {o.cache!r} is not one of {', '.join(CACHE_MODES)}")
    if o.pvc_access_mode not in ACCESS_MODES:
        problems.append(f"--pvc-access-mode {o.pvc_access_mode!r} is not one of {', '.join(ACCESS_MODES)}")
    if not _QUANTITY.fullmatch(o.pvc_size) or float(re.sub(r"[A-Za-z]+$", "", o.pvc_size) or 0) == 0:
        problems.append(f"--pvc-size {o.pvc_size!r} is not a Kubernetes quantity above zero such as 100Gi")
    problems += _scaling_problems(o)
    problems += _cache_problems(o) + _pod_problems(o)
    if o.image and o.registry:
        problems.append("--image and --registry exclude each other (--registry only prefixes the default image)")
    if o.warm_job and o.cache != "pvc":
        problems.append("--warm-job needs --cache pvc: an emptyDir dies with the Job's pod")
    if o.warm_job and o.storage_uri and not o.storage_uri.startswith("pvc://"):
        problems.append(
            "--warm-job can only read a model given as --model-id or a pvc:// --storage-uri "
            "(the storage initializer runs for InferenceServices only)"
        )
    return problems


def _cache_problems(o: KServeFields) -> list[str]:
    """A cache PVC that several pods mount must attach on several nodes: ReadWriteMany, or one line saying so."""
    if o.pvc_storage_class is not None and o.cache != "pvc":
        return ["--pvc-storage-class needs --cache pvc"]
    if o.pvc_storage_class is not None and not _dns_subdomain(o.pvc_storage_class):
        return [f"--pvc-storage-class {o.pvc_storage_class!r} must be a DNS subdomain (a StorageClass name)"]
    if o.cache != "pvc" or o.pvc_access_mode != "ReadWriteOnce" or not _counts_valid(o) or not o.cache_sharers:
        return []
    return [
        f"--pvc-access-mode ReadWriteOnce: the cache PVC is mounted by several pods ({'; '.join(o.cache_sharers)}), "
        "which may run on different nodes, and a ReadWriteOnce volume attaches to one node: pass --pvc-access-mode "
        "ReadWriteMany (with --pvc-storage-class naming a class that provides it), or --cache emptydir"
    ]


def _counts_valid(o: KServeFields) -> bool:
    return all(isinstance(v, int) and v >= 1 for v in (o.nodes, o.min_replicas, o.max_replicas))


def _dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(value))


def _pod_problems(o: KServeFields) -> list[str]:
    """Placement, identity, extra environment and resources, as the API server and the entrypoint would check them."""
    problems = []
    for item in o.node_selector:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            problems.append(f"--node-selector {item!r} is not KEY=VALUE with a label key and value")
    problems += [f"--toleration {item!r} {why}" for item in o.tolerations if (why := _toleration_problem(item))]
    if o.affinity is not None:
        problems += _affinity_problems(o.affinity)
    for label, names in (
        ("--image-pull-secret", o.image_pull_secrets),
        ("--service-account", (o.service_account,) if o.service_account is not None else ()),
        ("--priority-class", (o.priority_class,) if o.priority_class is not None else ()),
    ):
        problems += [
            f"{label} {n!r} must be a DNS subdomain (a Kubernetes name)" for n in names if not _dns_subdomain(n)
        ]
    problems += [f"--env {item!r} {why}" for item in o.env if (why := _env_problem(item))]
    env_names = [item.partition("=")[0] for item in o.env]
    problems += [f"--env {n} is given twice" for n in sorted({n for n in env_names if env_names.count(n) > 1})]
    return problems + _resource_problems(o)


def _toleration_problem(item: str) -> str | None:
    rest, _, effect = item.rpartition(":") if ":" in item else (item, "", "")
    key, _, value = rest.partition("=")
    if effect and effect not in TAINT_EFFECTS:
        return f"has effect {effect!r}, not one of {', '.join(TAINT_EFFECTS)}"
    if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
        return "is not KEY[=VALUE][:EFFECT] with a label key and value (e.g. nvidia.com/gpu:NoSchedule)"
    return None


def toleration(item: str) -> dict[str, str]:
    """A Kubernetes toleration from KEY[=VALUE][:EFFECT]: Equal with a value, Exists without; no effect: all."""
    rest, _, effect = item.rpartition(":") if ":" in item else (item, "", "")
    key, sep, value = rest.partition("=")
    found = {"key": key, "operator": "Equal" if sep else "Exists", "value": value if sep else None, "effect": effect}
    return {k: v for k, v in found.items() if v}


def _affinity_problems(text: str) -> list[str]:
    try:
        affinity = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"--affinity is not JSON ({exc.msg} at character {exc.pos})"]
    if not isinstance(affinity, dict) or not affinity:
        return ["--affinity must be a JSON object with nodeAffinity, podAffinity or podAntiAffinity"]
    unknown = sorted(set(affinity) - set(AFFINITY_KINDS))
    if unknown:
        return [f"--affinity has {', '.join(unknown)}; a Kubernetes Affinity holds only {', '.join(AFFINITY_KINDS)}"]
    return [f"--affinity {kind} must be a JSON object" for kind, v in affinity.items() if not isinstance(v, dict)]


# The variables the generator sets itself, with the option that sets each (None: derived, not settable).
OWNED_VARIABLES = {
    "MODEL_ID": "--model-id",
    "MODEL_REVISION": "--model-revision",
    "TP_SIZE": "--tp-size",
    "PP_SIZE": "--pp-size",
    "FRONTEND": "--frontend",
    "HF_TOKEN": "--hf-token-secret",
    "TRITON_ADMIN_KEY": "--admin-key-secret",
    "SERVED_MODEL_NAME": "--name",
    "CACHE_DIR": None,
    "HTTP_PORT": None,
    "GRPC_PORT": None,
    "METRICS_PORT": None,
    "OPENAI_PORT": None,
}


def _env_problem(item: str) -> str | None:
    name, sep, _ = item.partition("=")
    if not sep or not _ENV_NAME.fullmatch(name):
        return "is not NAME=VALUE with a variable name (letters, digits, '_', not starting with a digit)"
    if name in OWNED_VARIABLES or name.startswith("LWS_"):
        owner = OWNED_VARIABLES.get(name)
        return f"is set by the generator{f' (use {owner})' if owner else ''}"
    if _SECRET_LIKE.search(name):
        return "looks like a secret, and a literal value would sit in the manifest: keep it in a Secret"
    return None


def _resource_problems(o: KServeFields) -> list[str]:
    problems = []
    cpus = {"--cpu": o.cpu, "--cpu-limit": o.cpu_limit}
    memories = {"--memory": o.memory, "--memory-limit": o.memory_limit}
    for label, value in cpus.items():
        if value is not None and (not _CPU.fullmatch(value) or _millicores(value) == 0):
            problems.append(f"{label} {value!r} is not a CPU quantity above zero such as 4 or 500m")
    for label, value in memories.items():
        if value is not None and (not _QUANTITY.fullmatch(value) or _bytes(value) == 0):
            problems.append(f"{label} {value!r} is not a memory quantity above zero such as 32Gi")
    if problems:
        return problems
    if o.cpu_limit is not None and _millicores(o.cpu_limit) < _millicores(o.cpu):
        problems.append(f"--cpu-limit {o.cpu_limit} is below the request --cpu {o.cpu}")
    if o.memory_limit is not None and _bytes(o.memory_limit) < _bytes(o.memory):
        problems.append(f"--memory-limit {o.memory_limit} is below the request --memory {o.memory}")
    return problems


def _millicores(value: str) -> float:
    return float(value[:-1]) if value.endswith("m") else float(value) * 1000


def _bytes(value: str) -> float:
    number, unit = re.match(r"^([0-9.]+)([A-Za-z]*)$", value).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def _parallelism_problems(o: KServeFields) -> list[str]:
    """TP_SIZE and PP_SIZE as the entrypoint reads them (its variable table), so no pod exits 2 at start."""
    problems = []
    for label, name, size in (("--tp-size", "TP_SIZE", o.tp_size), ("--pp-size", "PP_SIZE", o.pp_size)):
        variable = VARIABLES[name]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append(f"{label} must be a positive integer, got {size!r}")
        elif variable.choices and size not in variable.choices:
            problems.append(f"{label} must be {variable.allowed_text.replace('`', '')}, got {size}")
        elif variable.high is not None and size > variable.high:
            problems.append(f"{label} must be at most {variable.high}, got {size}")
    return problems


def _storage_problems(uri: str | None, label: str = "--storage-uri") -> list[str]:
    """A pvc:// URI names a claim (a DNS subdomain) and a path inside it that stays inside it."""
    if uri is None or not uri.startswith("pvc://"):
        return []
    claim, _, path = uri[len("pvc://") :].partition("/")
    problems = []
    if len(claim) > 253 or not _DNS_SUBDOMAIN.fullmatch(claim):
        problems.append(f"{label} {uri!r} must name a PersistentVolumeClaim: pvc://<claim>[/<path>]")
    if any(part in (".", "..") for part in path.split("/")):
        problems.append(f"{label} {uri!r} may not leave the claim ('.' or '..' in the path)")
    return problems


def _scaling_problems(o: KServeFields) -> list[str]:
    problems = []
    counts = (("--min-replicas", o.min_replicas, 1), ("--max-replicas", o.max_replicas, 1), ("--nodes", o.nodes, 1))
    for label, value, least, most in (
        *((label, value, least, INT32_MAX) for label, value, least in counts),
        ("--scale-down-window", o.scale_down_window, 0, HPA_MAX_WINDOW),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            problems.append(f"{label} must be an integer of at least {least} and at most {most}, got {value!r}")
    if isinstance(o.min_replicas, int) and isinstance(o.max_replicas, int) and o.max_replicas < o.min_replicas:
        problems.append(f"--max-replicas {o.max_replicas} is below --min-replicas {o.min_replicas}")
    if not isinstance(o.scale_target, (int, float)) or not 0.001 <= o.scale_target <= 1000:
        problems.append(f"--scale-target must be a ratio from 0.001 to 1000, got {o.scale_target!r}")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", o.prometheus_url):
        problems.append(f"--prometheus-url {o.prometheus_url!r} is not an http(s) URL")
    if o.ssh_secret is not None and (len(o.ssh_secret) > 63 or not _DNS_LABEL.fullmatch(o.ssh_secret)):
        problems.append(f"--ssh-secret {o.ssh_secret!r} must be a DNS label")
    if not isinstance(o.nodes, int) or o.nodes < 2 or not isinstance(o.tp_size, int) or not isinstance(o.pp_size, int):
        return problems
    if o.gpus % o.nodes:
        problems.append(
            f"--tp-size x --pp-size = {o.gpus} GPUs cannot be split evenly over --nodes {o.nodes}: give a node count "
            "that divides it"
        )
    if o.storage_uri is not None:
        problems.append(
            "a multi-node group (--nodes) reads its model by --model-id (no KServe storage initializer runs)"
        )
    if o.warm_job:
        problems.append("--warm-job is for single-node services: every pod of a group prepares from the shared cache")
    if len(o.name) > 40:  # LWS names pods <name>-<group>-<worker>, and they must stay DNS labels
        problems.append(f"--name {o.name!r} is longer than 40 characters, too long for a multi-node group (--nodes)")
    return problems
