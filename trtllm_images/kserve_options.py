"""The options of `build.py kserve` and their validation: everything the entrypoint or KServe would refuse later is
refused here, as one UsageError, before any manifest is rendered or written."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trtllm_images.errors import UsageError

CACHE_MODES = ("emptydir", "pvc")
FRONTENDS = ("triton", "openai")  # the entrypoint's FRONTEND values
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany")

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
# What the entrypoint accepts (its settings.py; a test compares): TP a power of two up to 64, PP 1 to 64.
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_PP_SIZE = 64


@dataclass(frozen=True)
class KServeOptions:
    tag: str
    image: str | None = None  # full image ref; default: the server image build.py makes for the tag
    registry: str | None = None  # prefix for the default image ref
    model_id: str | None = None  # hub id; None -> the model that storage_uri puts at /mnt/models
    model_revision: str | None = None
    storage_uri: str | None = None
    tp_size: int = 1
    pp_size: int = 1
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


def _problems(o: KServeOptions) -> list[str]:
    problems = []
    for label, value in (
        ("name", o.name),
        ("namespace", o.namespace),
        ("pvc name", o.claim),
        ("hf token secret", o.hf_token_secret or "x"),
        ("admin key secret", o.admin_key_secret or "x"),
    ):
        if len(value) > 63 or not _DNS_LABEL.match(value):
            problems.append(f"{label} {value!r} must be a DNS label (lowercase letters, digits, '-', at most 63)")
    if len(o.name) > 45:  # KServe and the warm Job append suffixes such as "-predictor" to it
        problems.append(f"name {o.name!r} is longer than 45 characters")
    if o.name in ("preprocessing", "postprocessing"):  # the served model takes the service's name
        problems.append(f"name {o.name!r} clashes with a model inside the Triton repository")
    if (o.model_id is None) == (o.storage_uri is None):
        problems.append("give exactly one of model_id (a hub id) and storage_uri (KServe puts it at /mnt/models)")
    if o.storage_uri is not None and "://" not in o.storage_uri:
        problems.append(f"storage_uri {o.storage_uri!r} needs a scheme such as hf://, s3://, gs://, pvc://")
    for label, size in (("tp_size", o.tp_size), ("pp_size", o.pp_size)):
        if not isinstance(size, int) or size < 1:
            problems.append(f"{label} must be a positive integer, got {size!r}")
    if isinstance(o.tp_size, int) and o.tp_size >= 1 and o.tp_size not in TP_SIZES:
        problems.append(f"tp_size must be a power of two: {', '.join(map(str, TP_SIZES))}, got {o.tp_size}")
    if isinstance(o.pp_size, int) and o.pp_size > MAX_PP_SIZE:
        problems.append(f"pp_size must be at most {MAX_PP_SIZE}, got {o.pp_size}")
    if not _DNS_1035_LABEL.match(o.name):
        problems.append(f"name {o.name!r} must start with a lowercase letter (KServe's rule for service names)")
    problems += _storage_problems(o.storage_uri)
    for label, ref in (("image", o.image), ("registry", o.registry and f"{o.registry}/trtllm-serve:x")):
        if ref and not _IMAGE_REF.match(ref):
            problems.append(f"{label} {getattr(o, label)!r} is not an image reference such as ghcr.io/org/name:tag")
    if o.frontend not in FRONTENDS:
        problems.append(f"frontend {o.frontend!r} is not one of {', '.join(FRONTENDS)}")
    if o.cache not in CACHE_MODES:
        problems.append(f"cache {o.cache!r} is not one of {', '.join(CACHE_MODES)}")
    if o.pvc_access_mode not in ACCESS_MODES:
        problems.append(f"pvc_access_mode {o.pvc_access_mode!r} is not one of {', '.join(ACCESS_MODES)}")
    if not _QUANTITY.match(o.pvc_size) or float(re.sub(r"[A-Za-z]+$", "", o.pvc_size) or 0) == 0:
        problems.append(f"pvc_size {o.pvc_size!r} is not a Kubernetes quantity above zero such as 100Gi")
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


def _storage_problems(uri: str | None) -> list[str]:
    """A pvc:// URI names a claim (a DNS subdomain) and a path inside it that stays inside it."""
    if uri is None or not uri.startswith("pvc://"):
        return []
    claim, _, path = uri[len("pvc://") :].partition("/")
    problems = []
    if len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim):
        problems.append(f"storage_uri {uri!r} must name a PersistentVolumeClaim: pvc://<claim>[/<path>]")
    if any(part in (".", "..") for part in path.split("/")):
        problems.append(f"storage_uri {uri!r} may not leave the claim ('.' or '..' in the path)")
    return problems
