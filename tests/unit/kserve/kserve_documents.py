"""What the KServe tests share: the options they generate with, and helpers that find documents and containers
in a plan."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import pytest

from trtllm_images import matrix
from trtllm_images.kserve import checks as kserve_checks
from trtllm_images.kserve import plan as kserve

REPO = Path(__file__).resolve().parents[3]


HUB_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


# The published examples: 25.01 is the first NGC tag that ships /app (backend templates) and the README's tag.
# deploy/kserve is the quick start's (docs/kserve.md): one pod on a ReadWriteOnce cache, what any cluster offers.
DEPLOY_OPTIONS = kserve.KServeOptions(tag="25.01", registry="ghcr.io/your-org", model_id=HUB_MODEL, cache="pvc")


# deploy/kserve-autoscaled: docs/kserve.md's autoscaled service, its replicas and warm Job on ReadWriteMany storage.
AUTOSCALED_OPTIONS = kserve.KServeOptions(
    tag="25.01",
    registry="ghcr.io/your-org",
    model_id=HUB_MODEL,
    cache="pvc",
    pvc_access_mode="ReadWriteMany",
    warm_job=True,
    max_replicas=4,
)


# docs/kserve.md's 2-node deployment: TP 16 over two 8-GPU nodes, the engine cache on ReadWriteMany storage.
MULTINODE_OPTIONS = kserve.KServeOptions(
    tag="25.01",
    registry="ghcr.io/your-org",
    model_id="meta-llama/Llama-3.1-405B-Instruct",
    tp_size=16,
    nodes=2,
    cache="pvc",
    pvc_access_mode="ReadWriteMany",
    pvc_size="2Ti",
    max_replicas=4,
)


DEPLOY_EXAMPLES = {
    "kserve": DEPLOY_OPTIONS,
    "kserve-autoscaled": AUTOSCALED_OPTIONS,
    "multinode": MULTINODE_OPTIONS,
}


@functools.cache
@functools.cache
def load_matrix():
    """matrix.yaml once per run: the records are frozen, and the grid renders dozens of plans from them."""
    return matrix.load()


def documents(options):
    return kserve.make_kserve_plan(load_matrix(), options).documents


def unknown_fields(instance, schema, path="") -> list[str]:
    """Fields the API server would silently prune: structural schemas list every allowed property."""
    if isinstance(instance, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        found = []
        for key, value in instance.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(value, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(instance, dict) and isinstance(schema.get("additionalProperties"), dict):
        values = schema["additionalProperties"]
        return [f for k, v in instance.items() for f in unknown_fields(v, values, f"{path}.{k}")]
    if isinstance(instance, list) and "items" in schema:
        return [f for i, v in enumerate(instance) for f in unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


# LeaderWorkerSet, the Prometheus Operator's PodMonitor and KEDA's ScaledObject, pinned in upstream.lock.json.
SCALE_OUT_CRDS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "lws/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "prometheus-operator/monitoring.coreos.com_podmonitors.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda/keda.sh_scaledobjects.yaml",
}


KUBERNETES_VERSION = "1.30"


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["40000"]}]}
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/part-of": "trtllm-images"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    },
}  # built-in kinds are validated against this release's own OpenAPI schemas


def builtin_errors(doc) -> list[str]:
    """Kubernetes' own schema for a built-in kind (PodSpec inside Jobs included), unknown fields refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def validation_errors(doc, crd_validators) -> list[str]:
    """Every document against its schema: a CRD's own, or Kubernetes' for built-in kinds; unknown kinds fail."""
    key = (doc["apiVersion"], doc["kind"])
    if key in crd_validators:
        return schema_errors(doc, crd_validators)
    if key in SCALE_OUT_CRDS:  # no source has this CRD here: test_scale_out_kinds_match_their_crds skips, naming it
        return []
    return builtin_errors(doc)


def schema_errors(doc, crd_validators) -> list[str]:
    validator, schema = crd_validators[(doc["apiVersion"], doc["kind"])]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    return errors + [f"{field}: not in the schema (would be pruned)" for field in unknown_fields(doc, schema)]


# Every knob a cluster sets (docs/kserve.md, "Cluster settings").
KNOBS = {
    "node_selector": ("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3", "pool=llm"),
    "tolerations": ("nvidia.com/gpu:NoSchedule", "dedicated=llm:NoExecute", "spot"),
    "affinity": json.dumps(AFFINITY),
    "image_pull_secrets": ("regcred", "mirror-cred"),
    "service_account": "llm-serving",
    "priority_class": "high-priority",
    "env": ("MAX_BATCH_SIZE=64", "NCCL_DEBUG=INFO"),
    "cpu": "8",
    "memory": "64Gi",
    "cpu_limit": "16",
    "memory_limit": "96Gi",
}


KNOBS_OPTIONS = kserve.KServeOptions(
    tag="25.01",
    model_id=HUB_MODEL,
    cache="pvc",
    pvc_access_mode="ReadWriteMany",
    pvc_storage_class="nfs-rwx",
    warm_job=True,
    max_replicas=3,
    **KNOBS,
)


def grid():
    sources = {
        "hub": {"model_id": HUB_MODEL},
        "pvc-storage": {"storage_uri": "pvc://models/llama-8b"},
        "s3-storage": {"storage_uri": "s3://bucket/llama-8b"},
    }
    for cache, namespaced, warm, (source, kwargs), tp in itertools.product(
        kserve_checks.CACHE_MODES, (False, True), (False, True), sources.items(), (1, 2, 4)
    ):
        if warm and (cache != "pvc" or source == "s3-storage"):
            continue
        options = kserve.KServeOptions(
            tag="25.01",
            cache=cache,
            pvc_access_mode="ReadWriteMany" if warm else "ReadWriteOnce",
            namespaced_runtime=namespaced,
            warm_job=warm,
            tp_size=tp,
            namespace="serving",
            **kwargs,
        )
        yield pytest.param(
            options, id=f"{cache}-{'ns' if namespaced else 'cluster'}-{'warm' if warm else 'nojob'}-{source}-tp{tp}"
        )
    for tag, cache, warm, tp, replicas in (
        ("25.01", "emptydir", False, 1, 1),
        ("24.12", "pvc", True, 2, 3),
        ("26.07", "pvc", False, 4, 1),
    ):
        options = kserve.KServeOptions(
            tag=tag,
            cache=cache,
            pvc_access_mode="ReadWriteMany" if warm else "ReadWriteOnce",
            warm_job=warm,
            tp_size=tp,
            model_id=HUB_MODEL,
            frontend="openai",
            max_replicas=replicas,
        )
        yield pytest.param(options, id=f"openai-{tag}-{cache}-{'warm' if warm else 'nojob'}-tp{tp}-max{replicas}")
    # Every knob a cluster sets, on a service and its warm Job: still valid against the schemas.
    yield pytest.param(KNOBS_OPTIONS, id="knobs-warm")


def by_kind(docs, kind):
    return next(doc for doc in docs if doc["kind"] == kind)


def runtime_container(docs):
    return docs[0]["spec"]["containers"][0]


def isvc_model(docs):
    return by_kind(docs, "InferenceService")["spec"]["predictor"]["model"]
