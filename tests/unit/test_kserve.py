"""KServe manifests: every generated document against KServe's own CRD schemas, plus the rules the schemas cannot
say."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from harness.image_data import write_image_data
from harness.upstream_files import UpstreamMissing, upstream_path
from harness.upstream_files import find as find_upstream
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import kserve, kserve_checks, kserve_findings, kserve_options, matrix, scaling
from trtllm_images.plan import make_build_plan

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
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


@pytest.fixture(scope="session")
def the_matrix():
    return _matrix()


@functools.cache
def _matrix():
    return matrix.load()


def documents(options):
    return kserve.make_kserve_plan(_matrix(), options).documents


@pytest.fixture(scope="session")
def entry(the_matrix):
    return the_matrix.get("25.01")


@pytest.fixture(scope="session")
def crd_validators():
    """(apiVersion, kind) -> (Draft7Validator, schema); the InferenceService CRD is ~2 MB, so parse it once."""
    jsonschema = pytest.importorskip("jsonschema")
    files = sorted(upstream_path("kserve/crd").glob("*.yaml"))
    assert files, "the upstream layout's kserve/crd holds the CRDs"
    for relpath in SCALE_OUT_CRDS.values():  # each from the first source that has it; a missing one skips later
        with contextlib.suppress(UpstreamMissing):
            files.append(find_upstream(relpath))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    validators = {}
    for path in files:
        crd = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            validators[(f"{group}/{version['name']}", kind)] = (jsonschema.Draft7Validator(schema), schema)
    return validators


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


@pytest.mark.parametrize("key", list(SCALE_OUT_CRDS), ids=lambda key: key[1])
def test_scale_out_kinds_match_their_crds(key, crd_validators):
    """Each scale-out kind we render, against its own pinned CRD (LWS, KEDA, the Prometheus Operator: each in the
    upstream layout, harness/upstream_files.py). Where no source has that CRD this skips with the reason, and fails
    under CI=true like every test that needs upstream files. The grid tests leave such documents to this test
    (Kubernetes' built-in schemas do not know the kind)."""
    assert upstream_path(SCALE_OUT_CRDS[key]).is_file()  # skips, or fails under CI=true, naming what is missing
    assert key in crd_validators
    options = [param.values[0] for param in scale_out_grid()]
    rendered = [doc for o in options for doc in documents(o) if (doc["apiVersion"], doc["kind"]) == key]
    assert rendered, f"no {key[1]} rendered by {options}"
    for doc in rendered:
        assert schema_errors(doc, crd_validators) == [], doc


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


def scale_out_grid():
    """Fixed and autoscaled services (both frontends), and multi-node groups: every document they add is validated
    too."""
    yield pytest.param(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL), id="fixed-replicas")
    yield pytest.param(
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, min_replicas=2, max_replicas=10, scale_target=0.5),
        id="autoscaled",
    )
    yield pytest.param(
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, frontend="openai", max_replicas=4), id="openai-autoscaled"
    )
    for nodes, tp, pp, cache, replicas in ((2, 16, 1, "pvc", 4), (2, 8, 2, "emptydir", 1), (4, 8, 4, "pvc", 3)):
        options = kserve.KServeOptions(
            tag="25.01",
            model_id=HUB_MODEL,
            nodes=nodes,
            tp_size=tp,
            pp_size=pp,
            cache=cache,
            pvc_access_mode="ReadWriteMany",
            max_replicas=replicas,
            node_selector=("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",),
            tolerations=("nvidia.com/gpu:NoSchedule",),
            affinity=json.dumps(AFFINITY),
            image_pull_secrets=("regcred",),
            service_account="llm-serving",
            priority_class="high-priority",
            env=("NCCL_DEBUG=INFO",),
            memory_limit="64Gi",
        )
        yield pytest.param(options, id=f"nodes{nodes}-tp{tp}-pp{pp}-{cache}-max{replicas}")


@pytest.mark.parametrize("options", list(scale_out_grid()))
def test_every_scale_out_document_is_valid_and_sound(options, crd_validators):
    docs = documents(options)
    for doc in docs:
        assert validation_errors(doc, crd_validators) == [], doc["kind"]
    kinds = {doc["kind"] for doc in docs}
    assert ("PodMonitor" in kinds) == options.autoscaled  # the autoscaler's data, needing the Prometheus Operator
    if options.nodes > 1:
        assert {"LeaderWorkerSet", "Service", "NetworkPolicy"} <= kinds and "InferenceService" not in kinds
        assert ("ScaledObject" in kinds) == options.autoscaled
    else:
        isvc = by_kind(docs, "InferenceService")
        assert ("autoScaling" in isvc["spec"]["predictor"]) == options.autoscaled
    assert list(yaml.safe_load_all(kserve.dump_yaml(docs))) == list(docs)


@pytest.mark.parametrize("options", list(grid()))
def test_every_document_is_valid_and_sound(options, entry, crd_validators):
    docs = documents(options)
    kinds = [doc["kind"] for doc in docs]
    assert kinds[0] == ("ServingRuntime" if options.namespaced_runtime else "ClusterServingRuntime")
    assert ("PersistentVolumeClaim" in kinds) == (options.cache == "pvc")
    assert ("Job" in kinds) == options.warm_job
    for doc in docs:
        assert validation_errors(doc, crd_validators) == [], doc["kind"]
    # What went through YAML comes back identical (no lossy scalars), and shared sub-objects did not become aliases.
    text = kserve.dump_yaml(docs)
    assert list(yaml.safe_load_all(text)) == list(docs) and "&id" not in text
    if options.cache == "pvc":
        claims = {v["persistentVolumeClaim"]["claimName"] for v in _pod_volumes(docs) if v["name"] == "trtllm-cache"}
        assert claims == {by_kind(docs, "PersistentVolumeClaim")["metadata"]["name"]}


def _pod_volumes(docs):
    for doc in docs:
        if doc["kind"] == "InferenceService":
            yield from doc["spec"]["predictor"]["volumes"]
        elif doc["kind"] == "Job":
            yield from doc["spec"]["template"]["spec"]["volumes"]


def by_kind(docs, kind):
    return next(doc for doc in docs if doc["kind"] == kind)


def test_runtime_contract(entry):
    docs = documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, tp_size=2, pp_size=2))
    runtime = by_kind(docs, "ClusterServingRuntime")
    assert runtime["metadata"]["name"] == "trtllm-25-01" and "namespace" not in runtime["metadata"]
    spec = runtime["spec"]
    assert spec["supportedModelFormats"] == [
        {"name": "tensorrt-llm", "version": "0.17.0", "autoSelect": True, "priority": 1}
    ]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"] == {"prometheus.kserve.io/port": "8002", "prometheus.kserve.io/path": "/metrics"}
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container" and "args" not in container and "command" not in container
    assert container["image"] == make_build_plan(entry, out_dir=Path(".")).image("server").ref
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        "HTTP_PORT": "8080",
        "GRPC_PORT": "8001",
        "METRICS_PORT": "8002",
        "CACHE_DIR": "/var/cache/trtllm",
        "SERVED_MODEL_NAME": "{{.Name}}",
        "TP_SIZE": "2",
        "PP_SIZE": "2",
    }
    assert container["ports"] == [{"name": "http1", "containerPort": 8080, "protocol": "TCP"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 3600
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 1000
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert {"name": "devshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in spec["volumes"]


def test_openai_runtime_serves_and_probes_the_frontend_on_the_http_port(the_matrix):
    docs = documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, frontend="openai"))
    runtime, service = by_kind(docs, "ClusterServingRuntime"), by_kind(docs, "InferenceService")
    assert runtime["metadata"]["name"] == "trtllm-25-01-openai" == service["spec"]["predictor"]["model"]["runtime"]
    (container,) = runtime["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["FRONTEND"], env["OPENAI_PORT"], env["METRICS_PORT"]) == ("openai", "8080", "8002")
    assert "HTTP_PORT" not in env
    assert (
        container["startupProbe"]["httpGet"]
        == container["readinessProbe"]["httpGet"]
        == {
            "path": "/health/ready",
            "port": 8080,
        }
    )
    assert container["livenessProbe"]["tcpSocket"] == {"port": 8080}
    # The OpenAI API is none of KServe's protocols: neither the runtime nor the service claims one (v1 would be
    # KServe's predict protocol). No gRPC port; tritonserver's metrics port beside the API, advertised as in Triton
    # mode, for the autoscaler.
    assert "protocolVersions" not in runtime["spec"]
    assert runtime["spec"]["annotations"] == {
        "prometheus.kserve.io/port": "8002",
        "prometheus.kserve.io/path": "/metrics",
    }
    model = service["spec"]["predictor"]["model"]
    assert "protocolVersion" not in model
    assert [(p["name"], p["containerPort"]) for p in model["ports"]] == [("http1", 8080), ("metrics", 8002)]
    with pytest.raises(UsageError, match="image 24.11 has no Triton OpenAI frontend") as refused:
        kserve.make_kserve_plan(the_matrix, kserve.KServeOptions(tag="24.11", model_id=HUB_MODEL, frontend="openai"))
    assert "--tag 24.12" in refused.value.hint
    with pytest.raises(UsageError, match="--frontend openai runs on one node"):
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, frontend="openai", nodes=2, tp_size=2)


def test_the_openai_mode_autoscales_on_the_same_signal_as_triton_mode():
    """tritonserver serves its metrics port beside the OpenAI front: the same query, PodMonitor and target."""

    def scaling_documents(frontend):
        docs = documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, frontend=frontend, max_replicas=4))
        service = by_kind(docs, "InferenceService")
        return (
            service["metadata"]["annotations"],
            service["spec"]["predictor"]["autoScaling"],
            by_kind(docs, "PodMonitor"),
        )

    openai, triton = scaling_documents("openai"), scaling_documents("triton")
    assert openai == triton
    assert openai[0]["serving.kserve.io/autoscalerClass"] == "keda"
    assert openai[2]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_inference_service_for_storage_uri_is_read_only_and_has_no_token(entry):
    options = kserve.KServeOptions(tag="25.01", storage_uri="s3://bucket/llama", name="chat", namespace="team-a")
    isvc = by_kind(documents(options), "InferenceService")
    assert isvc["metadata"]["namespace"] == "team-a"
    assert isvc["metadata"]["annotations"]["storage.kserve.io/readonly"] == "true"
    model = isvc["spec"]["predictor"]["model"]
    assert model["storageUri"] == "s3://bucket/llama" and model["runtime"] == "trtllm-25-01"
    assert model["modelFormat"] == {"name": "tensorrt-llm"} and model["protocolVersion"] == "v2"
    names = [e["name"] for e in model["env"]]
    assert "MODEL_ID" not in names and "HF_TOKEN" not in names
    assert [p["name"] for p in model["ports"]] == ["http1", "grpc-v2", "metrics"]
    assert isvc["spec"]["predictor"]["volumes"] == [{"name": "trtllm-cache", "emptyDir": {}}]
    writable = kserve.KServeOptions(tag="25.01", storage_uri="s3://bucket/llama", storage_readonly=False)
    assert (
        by_kind(documents(writable), "InferenceService")["metadata"]["annotations"]["storage.kserve.io/readonly"]
        == "false"
    )


def test_hub_model_token_comes_from_a_secret(entry):
    options = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, model_revision="abc123", hf_token_secret="my-hf")
    model = by_kind(documents(options), "InferenceService")["spec"]["predictor"]["model"]
    env = {e["name"]: e for e in model["env"]}
    assert env["MODEL_ID"]["value"] == HUB_MODEL and env["MODEL_REVISION"]["value"] == "abc123"
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "my-hf", "key": "token", "optional": True}},
    }
    no_token = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, hf_token_secret=None)
    model = by_kind(documents(no_token), "InferenceService")["spec"]["predictor"]["model"]
    assert "HF_TOKEN" not in [e["name"] for e in model["env"]]


def test_the_admin_key_comes_from_a_secret_for_the_serving_pod_only():
    docs = documents(dataclasses.replace(AUTOSCALED_OPTIONS, admin_key_secret="llm-admin"))
    model = by_kind(docs, "InferenceService")["spec"]["predictor"]["model"]
    env = {e["name"]: e for e in model["env"]}
    assert env["TRITON_ADMIN_KEY"] == {
        "name": "TRITON_ADMIN_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llm-admin", "key": "key", "optional": True}},
    }
    (job_container,) = by_kind(docs, "Job")["spec"]["template"]["spec"]["containers"]
    assert "TRITON_ADMIN_KEY" not in [e["name"] for e in job_container["env"]]
    no_key = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, admin_key_secret=None)
    model = by_kind(documents(no_key), "InferenceService")["spec"]["predictor"]["model"]
    assert "TRITON_ADMIN_KEY" not in [e["name"] for e in model["env"]]


def test_pvc_and_warm_job_share_the_cache_and_the_engine_settings(entry):
    options = kserve.KServeOptions(
        tag="25.01",
        storage_uri="pvc://models/llama/8b",
        cache="pvc",
        warm_job=True,
        tp_size=2,
        pvc_size="500Gi",
        pvc_access_mode="ReadWriteMany",
    )
    docs = documents(options)
    assert [d["kind"] for d in docs] == ["ClusterServingRuntime", "PersistentVolumeClaim", "InferenceService", "Job"]
    pvc = by_kind(docs, "PersistentVolumeClaim")
    assert pvc["apiVersion"] == "v1" and pvc["metadata"]["name"] == "llm-trtllm-cache"
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "500Gi"}}}
    job = by_kind(docs, "Job")
    assert job["apiVersion"] == "batch/v1"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["fsGroup"] == 1000
    (container,) = pod["containers"]
    assert container["args"] == ["prepare"] and "command" not in container
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    model = by_kind(docs, "InferenceService")["spec"]["predictor"]["model"]
    # Same settings -> same engine cache key; only the serving pod gets the admin key.
    assert container["env"] == [e for e in model["env"] if e["name"] != "TRITON_ADMIN_KEY"]
    assert container["image"] == by_kind(docs, "ClusterServingRuntime")["spec"]["containers"][0]["image"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["trtllm-cache"]["mountPath"] == "/var/cache/trtllm"
    assert mounts["models"] == {"name": "models", "mountPath": "/mnt/models", "readOnly": True, "subPath": "llama/8b"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["trtllm-cache"]["persistentVolumeClaim"]["claimName"] == "llm-trtllm-cache"
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert job["spec"]["activeDeadlineSeconds"] >= 2 * 3600


def test_explicit_image_and_registry(entry):
    explicit = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, image="registry.local/x@sha256:" + "a" * 64)
    runtime = documents(explicit)[0]
    assert runtime["spec"]["containers"][0]["image"] == "registry.local/x@sha256:" + "a" * 64
    registry = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, registry="ghcr.io/acme")
    image = documents(registry)[0]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/acme/trtllm-serve:25.01-trtllm-0.17.0"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of --model-id"),
        ({"model_id": HUB_MODEL, "storage_uri": "s3://b/m"}, "exactly one of --model-id"),
        ({"storage_uri": "/data/model"}, "needs a scheme"),
        ({"model_id": HUB_MODEL, "tp_size": 0}, "--tp-size must be a positive integer"),
        ({"model_id": HUB_MODEL, "pp_size": "2"}, "--pp-size must be a positive integer"),
        ({"model_id": HUB_MODEL, "cache": "hostpath"}, "--cache 'hostpath' is not one of emptydir, pvc"),
        ({"model_id": HUB_MODEL, "name": "My_Model"}, "--name 'My_Model' must be a DNS label"),
        ({"model_id": HUB_MODEL, "namespace": "x" * 64}, "--namespace"),
        ({"model_id": HUB_MODEL, "name": "x" * 46}, "longer than 45"),
        ({"model_id": HUB_MODEL, "name": "preprocessing"}, "clashes with a model inside the Triton repository"),
        ({"model_id": HUB_MODEL, "cache": "pvc", "pvc_size": "lots"}, "--pvc-size 'lots'"),
        ({"model_id": HUB_MODEL, "pvc_access_mode": "ReadOnlyMany"}, "--pvc-access-mode"),
        (
            {"model_id": HUB_MODEL, "image": "a/b:c", "registry": "ghcr.io/x"},
            "--image and --registry exclude each other",
        ),
        ({"model_id": HUB_MODEL, "warm_job": True}, "--warm-job needs --cache pvc"),
        ({"storage_uri": "s3://b/m", "cache": "pvc", "warm_job": True}, "pvc:// --storage-uri"),
        ({"model_id": HUB_MODEL, "hf_token_secret": "HF"}, "--hf-token-secret 'HF'"),
        # what the entrypoint or the cluster refused later, after exit 0
        ({"model_id": HUB_MODEL, "tp_size": 3}, "--tp-size must be a power of two"),
        ({"model_id": HUB_MODEL, "tp_size": 128}, "--tp-size must be a power of two"),
        ({"model_id": HUB_MODEL, "pp_size": 65}, "--pp-size must be at most 64"),
        ({"model_id": HUB_MODEL, "name": "1abc"}, "must start with a lowercase letter"),
        (
            {"model_id": HUB_MODEL, "cache": "pvc", "pvc_size": "0"},
            "--pvc-size '0' is not a Kubernetes quantity above zero",
        ),
        ({"model_id": HUB_MODEL, "cache": "pvc", "pvc_size": "0Gi"}, "above zero"),
        ({"storage_uri": "pvc://"}, "must name a PersistentVolumeClaim"),
        ({"storage_uri": "pvc://claim/../etc"}, "may not leave the claim"),
        ({"storage_uri": "pvc://Claim_1/model"}, "must name a PersistentVolumeClaim"),
        ({"model_id": HUB_MODEL, "image": "Bad Image"}, "--image 'Bad Image' is not an image reference"),
        ({"model_id": HUB_MODEL, "image": "ghcr.io/Org/x:1"}, "is not an image reference"),
        (
            {"model_id": HUB_MODEL, "registry": "ghcr.io/my org"},
            "--registry 'ghcr.io/my org' is not an image reference",
        ),
    ],
)
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as info:
        kserve.KServeOptions(tag="25.01", **kwargs)
    assert message in info.value.message and info.value.exit_code == 2


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        "localhost:5000/a/b",
        "registry.example.com/team/llm-server:prod",
        "x@sha256:" + "a" * 64,
    ],
)
def test_good_image_references_are_accepted(image):
    assert kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, image=image).image == image


@pytest.mark.parametrize(
    "args", [["--tp-size", "3"], ["--name", "1abc"], ["--pvc-size", "0", "--cache", "pvc"], ["--image", "Bad Image"]]
)
def test_kserve_command_refuses_bad_options_with_one_line_and_writes_nothing(tmp_path, args):
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    result = CliRunner().invoke(
        cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--out", str(tmp_path / "out"), *args]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: invalid KServe options: ") and result.stderr.count("\n") == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "replicas", "kinds"),
    [
        ([], (1, 1), ["ClusterServingRuntime", "InferenceService"]),
        (["--min-replicas", "3"], (3, 3), ["ClusterServingRuntime", "InferenceService"]),
        (["--max-replicas", "4"], (1, 4), ["ClusterServingRuntime", "InferenceService", "PodMonitor"]),
        (
            ["--frontend", "openai", "--max-replicas", "3"],
            (1, 3),
            ["ClusterServingRuntime", "InferenceService", "PodMonitor"],
        ),
    ],
)
def test_autoscaling_is_opt_in(tmp_path, args, replicas, kinds):
    """By default a fixed count that runs on KServe alone; --max-replicas above --min-replicas adds KEDA autoscaling
    and the PodMonitor it reads, in either frontend."""
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    result = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, *args])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == kinds
    service = by_kind(docs, "InferenceService")
    predictor = service["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == replicas
    autoscaled = replicas[1] > replicas[0]
    assert ("autoScaling" in predictor) == autoscaled
    assert ("serving.kserve.io/autoscalerClass" in service["metadata"]["annotations"]) == autoscaled


def test_unsupported_tag_is_refused(the_matrix):
    unsupported = next(e for e in the_matrix.entries if not e.supported)
    for image in (None, "registry.local/custom:1"):
        with pytest.raises(UsageError, match="not supported"):
            kserve.make_kserve_plan(
                the_matrix, kserve.KServeOptions(tag=unsupported.tag, model_id=HUB_MODEL, image=image)
            )


def _default_docs(entry):
    options = dataclasses.replace(AUTOSCALED_OPTIONS, registry=None)
    return documents(options)


def _runtime_container(docs):
    return docs[0]["spec"]["containers"][0]


def _isvc_model(docs):
    return by_kind(docs, "InferenceService")["spec"]["predictor"]["model"]


BREAKAGES = {
    "container renamed": (lambda d: _runtime_container(d).update(name="main"), "no container named kserve-container"),
    "unknown protocol": (lambda d: d[0]["spec"].update(protocolVersions=["v2", "v3"]), "protocolVersions ['v3']"),
    "grpc port misnamed": (lambda d: _isvc_model(d)["ports"][1].update(name="rpc"), "gRPC port 8001 is named 'rpc'"),
    "gpu count": (lambda d: _isvc_model(d)["resources"]["limits"].update({"nvidia.com/gpu": "2"}), "TP_SIZE*PP_SIZE"),
    "literal token": (lambda d: _isvc_model(d)["env"].append({"name": "HF_TOKEN", "value": "x"}), "literal value"),
    "token in args": (lambda d: _runtime_container(d).update(args=["--token=hf_" + "a" * 30]), "Hugging Face token"),
    "no liveness": (lambda d: _runtime_container(d).pop("livenessProbe"), "no livenessProbe"),
    "short startup": (
        lambda d: _runtime_container(d)["startupProbe"].update(failureThreshold=10),
        "startupProbe allows",
    ),
    "unknown image": (lambda d: _runtime_container(d).update(image="trtllm-serve:99.01-trtllm-9"), "not one build.py"),
    "v1 protocol": (lambda d: _isvc_model(d).pop("protocolVersion"), "protocolVersion 'v1' is not offered"),
    "wrong runtime": (lambda d: _isvc_model(d).update(runtime="kserve-tritonserver"), "runtime 'kserve-tritonserver'"),
    "wrong format": (lambda d: _isvc_model(d).update(modelFormat={"name": "onnx"}), "modelFormat"),
    "competes": (
        lambda d: d[0]["spec"]["supportedModelFormats"].append({"name": "triton", "version": "2", "autoSelect": True}),
        "competes",
    ),
    "job gpu": (
        lambda d: by_kind(d, "Job")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(
            {"nvidia.com/gpu": "8"}
        ),
        "Job/llm-warm-cache",
    ),
}


@pytest.mark.parametrize("name", BREAKAGES)
def test_semantic_findings_catch_broken_documents(name, entry, the_matrix):
    docs = _default_docs(entry)
    breaker, expected = BREAKAGES[name]
    breaker(docs)
    findings = kserve_findings.semantic_findings(docs, the_matrix)
    assert any(expected in finding for finding in findings), findings


def test_a_plan_breaking_kserve_rules_is_refused(monkeypatch):
    monkeypatch.setattr(
        "trtllm_images.pod.shm_volume",
        lambda: {"name": "devshm", "emptyDir": {}, "env": [{"name": "API_KEY", "value": "literal"}]},
    )
    with pytest.raises(Error, match="break KServe's rules: .*API_KEY has a literal value"):
        kserve.make_kserve_plan(_matrix(), kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL))


def test_printing_and_files_render_the_same_plan(the_matrix):
    plan = kserve.make_kserve_plan(the_matrix, DEPLOY_OPTIONS)
    files = kserve.render_files(plan)
    header = files["runtime.yaml"].split("---", 1)[0]
    assert header.startswith("# Generated by: python build.py kserve")
    assert kserve.render_manifests(plan).startswith(header)
    assert list(yaml.safe_load_all(kserve.render_manifests(plan))) == list(plan.documents)
    assert [doc for text in files.values() for doc in yaml.safe_load_all(text)] == list(plan.documents)


def test_two_runtimes_with_the_same_format_priority_are_caught(entry):
    docs = _default_docs(entry)
    twin = copy.deepcopy(docs[0])
    twin["metadata"]["name"] = "trtllm-other"
    findings = kserve_findings.semantic_findings([docs[0], twin])
    assert any("has priority 1 like trtllm-25-01" in f for f in findings), findings


@pytest.mark.parametrize(
    "breaker, expected",
    [
        (lambda spec: spec["supportedModelFormats"][0].update(priority=0), "less than the minimum of 1"),
        (lambda spec: spec["containers"][0].update(args="serve"), "is not of type 'array'"),
        (lambda spec: spec["containers"][0].update(imagePullPolicy=None), "None is not of type 'string'"),
        (lambda spec: spec["containers"][0].update(startupProbes={}), "not in the schema"),
    ],
)
def test_schema_catches_broken_runtime(breaker, expected, entry, crd_validators):
    runtime = _default_docs(entry)[0]
    breaker(runtime["spec"])
    errors = schema_errors(runtime, crd_validators)
    assert any(expected in error for error in errors), errors


def test_command_line_names_only_what_differs_from_the_defaults():
    assert kserve.command_line(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL)) == (
        f"python build.py kserve --tag 25.01 --model-id {HUB_MODEL}"
    )
    options = kserve.KServeOptions(
        tag="25.01",
        storage_uri="s3://b/m",
        tp_size=2,
        namespaced_runtime=True,
        hf_token_secret=None,
        admin_key_secret=None,
        storage_readonly=False,
    )
    assert kserve.command_line(options) == (
        "python build.py kserve --tag 25.01 --storage-uri s3://b/m --tp-size 2 "
        "--namespaced-runtime --no-hf-token --no-admin-key --storage-writable"
    )


def test_the_cli_takes_its_defaults_from_kserve_options():
    """`build.py kserve` with only the required flags gives KServeOptions' own defaults, and each click option's
    default is its field's: a default is written once, in the dataclass."""
    from trtllm_images.cli import kserve_command

    context = kserve_command.make_context("kserve", ["--tag", "25.01", "--model-id", HUB_MODEL])
    flags = {k: v for k, v in context.params.items() if k not in ("matrix_path", "out_dir")}
    assert kserve_options.from_flags(flags) == kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL)
    for field in dataclasses.fields(kserve.KServeOptions):
        if field.name in ("tag", "model_id"):
            continue
        (option,) = (o for o in kserve_options.OPTIONS if o.field == field.name and not o.clears)
        parsed = flags[option.keyword]
        if isinstance(field.default, bool):  # a switch: given, it flips the field's default
            assert parsed is False, field.name
        elif option.follows:  # left out, the field takes another's value (from_flags above)
            assert parsed is None, field.name
        else:
            assert parsed == field.default, field.name
    assert {o.keyword for o in kserve_options.OPTIONS} == set(flags), "every click option of kserve is in OPTIONS"
    with pytest.raises(click.MissingParameter) as missing:  # a field without a default is a required flag
        kserve_command.make_context("kserve", ["--model-id", HUB_MODEL])
    assert missing.value.param is not None and missing.value.param.name == "tag"


def test_flags_round_trip_through_the_option_table():
    """The command line stamped into generated files (to_flags) parses back into the same options (from_flags)."""
    from trtllm_images.cli import kserve_command

    options = dataclasses.replace(KNOBS_OPTIONS, hf_token_secret=None, admin_key_secret=None, storage_readonly=False)

    context = kserve_command.make_context("kserve", kserve_options.to_flags(options))
    flags = {k: v for k, v in context.params.items() if k not in ("matrix_path", "out_dir")}
    assert kserve_options.from_flags(flags) == options


def test_messages_name_only_flags_that_exist():
    text = (REPO / "trtllm_images" / "kserve_checks.py").read_text()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))
    assert named and named <= {o.name for o in kserve_options.OPTIONS}, named - {o.name for o in kserve_options.OPTIONS}


def test_write_files_leaves_no_temp_files(tmp_path, entry):
    files = kserve.render_files(kserve.make_kserve_plan(_matrix(), DEPLOY_OPTIONS))
    written = kserve.write_files(tmp_path / "out", files)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(files) == sorted(p.name for p in written)
    assert all(p.read_text() == files[p.name] for p in written)


@pytest.mark.parametrize("folder", sorted(DEPLOY_EXAMPLES))
def test_deploy_files_are_current(entry, folder):
    """deploy/kserve and deploy/multinode are generated; a change in kserve.py must come with regenerated files."""
    options = DEPLOY_EXAMPLES[folder]
    expected = kserve.render_files(kserve.make_kserve_plan(_matrix(), options))
    directory = DEPLOY / folder
    actual = {p.name: p.read_text(encoding="utf-8") for p in directory.glob("*.yaml")} if directory.is_dir() else {}
    refresh = (
        f"refresh with: {kserve.command_line(options)} --out deploy/{folder} "
        f"(or: python -c 'import tests.unit.test_kserve as t; t.refresh_deploy()')"
    )
    assert sorted(actual) == sorted(expected), refresh
    for name, text in expected.items():
        assert actual[name] == text, f"deploy/{folder}/{name} is stale; {refresh}"


def refresh_deploy() -> None:
    for folder, options in DEPLOY_EXAMPLES.items():
        kserve.write_files(DEPLOY / folder, kserve.render_files(kserve.make_kserve_plan(_matrix(), options)))


@pytest.fixture(scope="module")
def compose():
    path = DEPLOY / "docker-compose.yaml"
    return path, yaml.safe_load(path.read_text(encoding="utf-8"))


def test_compose_file_serves_one_gpu_host(compose, entry):
    _, data = compose
    (service,) = data["services"].values()
    # The default image is what `python build.py --tag 25.01` builds locally.
    assert service["image"] == f"${{TRTLLM_IMAGE:-{make_build_plan(entry, out_dir=Path('.')).image('server').ref}}}"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert service["ports"] == ["8000:8000", "8001:8001", "8002:8002"]  # the image's (Triton's) default ports
    assert service["shm_size"] == "8gb" and service["ulimits"]["memlock"] == -1
    env = service["environment"]
    assert env["MODEL_ID"].startswith("${MODEL_ID:-") and env["CACHE_DIR"] == contract.DEFAULT_CACHE_DIR
    assert env["HF_TOKEN"] is None  # passed through from the caller's environment, never written down
    # The admin key comes from a secrets file the user creates (gitignored), read by the entrypoint from the file.
    assert service["secrets"] == ["triton-admin-key"]
    assert env["TRITON_ADMIN_KEY_FILE"] == "/run/secrets/triton-admin-key" and "TRITON_ADMIN_KEY" not in env
    assert data["secrets"]["triton-admin-key"]["file"].endswith("./triton-admin-key}")
    assert service["volumes"] == [f"trtllm-cache:{contract.DEFAULT_CACHE_DIR}"] and "trtllm-cache" in data["volumes"]
    assert service["stop_grace_period"] == f"{contract.STOP_GRACE_SECS}s" and service["restart"] == "unless-stopped"


def compose_config(path: Path, tmp_path: Path) -> list[str]:
    """Compose v2's `config` over the file, or else v1's (`docker-compose` 1.29, what Debian packages), which
    predates the top-level `name`: it gets the file without it, and the name as its project name."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose", "-f", str(path), "config", "--quiet"]
    v1 = shutil.which("docker-compose")
    if v1 is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed; the structure is checked above")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    name = data.pop("name")
    copy_ = tmp_path / path.name
    copy_.write_text(yaml.safe_dump(data), encoding="utf-8")
    return [v1, "-p", name, "--project-directory", str(path.parent), "-f", str(copy_), "config", "--quiet"]


@pytest.mark.process
def test_compose_config_accepts_the_file(compose, tmp_path):
    path, _ = compose
    result = subprocess.run(compose_config(path, tmp_path), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_compose_config_refuses_a_broken_file(compose, tmp_path):
    """The check above can fail: an option Compose does not know is refused."""
    path, data = compose
    broken = copy.deepcopy(data)
    (service,) = broken["services"].values()
    service["ulimit"] = service.pop("ulimits")
    bad = tmp_path / "bad" / path.name
    bad.parent.mkdir()
    bad.write_text(yaml.safe_dump(broken), encoding="utf-8")
    result = subprocess.run(compose_config(bad, tmp_path), capture_output=True, text=True)
    assert result.returncode != 0 and "ulimit" in result.stdout + result.stderr


def test_cli_reproduces_the_stamped_command(tmp_path, entry):
    """The command written into each file's header, run through the real CLI, gives the same files."""
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    for options in (*DEPLOY_EXAMPLES.values(), KNOBS_OPTIONS):
        out = tmp_path / str(id(options))
        args = shlex.split(kserve.command_line(options))[2:]  # drop "python build.py"
        result = CliRunner().invoke(cli, [*args, "--out", str(out)])
        assert result.exit_code == 0, result.output
        expected = kserve.render_files(kserve.make_kserve_plan(_matrix(), options))
        assert {p.name: p.read_text() for p in out.iterdir()} == expected


def _pod_environments(docs):
    """The environment each pod's container gets: runtime env merged with the InferenceService's, or the Job's."""
    runtime = {e["name"]: e.get("value") for e in _runtime_container(docs).get("env", []) if "value" in e}
    for doc in docs:
        if doc["kind"] == "InferenceService":
            model = {e["name"]: e["value"] for e in _isvc_model([doc]).get("env", []) if "value" in e}
            yield "InferenceService", {**runtime, **model}
        elif doc["kind"] == "Job":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            yield "Job", {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize("options", list(grid()))
def test_the_entrypoint_accepts_every_generated_environment(options, entry, tmp_path):
    """The manifests and the container's settings validation must agree, or every pod exits 2 at start."""
    from trtllm_entrypoint.image_facts import load_facts
    from trtllm_entrypoint.settings import Settings

    matrix_file = write_image_data(tmp_path)
    facts = load_facts({"MATRIX_TAG": entry.tag, "TRTLLM_MATRIX_FILE": str(matrix_file)})
    docs = documents(options)
    environments = list(_pod_environments(docs))
    assert [kind for kind, _ in environments] == ["InferenceService"] + (["Job"] if options.warm_job else [])
    for kind, env in environments:
        # KServe fills {{.Name}} with the InferenceService's name before the pod starts.
        env = {k: v.replace("{{.Name}}", options.name) for k, v in env.items()}
        settings = Settings.from_env(env, facts)
        assert settings.tp_size == options.tp_size, kind
        if kind == "InferenceService" and options.frontend == "openai":
            # The OpenAI API on KServe's HTTP port, where the probes ask; nothing else is served.
            assert (settings.frontend, settings.openai_port) == ("openai", 8080)
        elif kind == "InferenceService":
            assert (settings.http_port, settings.grpc_port) == (8080, 8001)


def test_kserve_command_without_a_registry_warns_that_a_cluster_cannot_pull_the_image():
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    bare = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL])
    given = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--registry", "ghcr.io/o"])
    assert bare.exit_code == 0 and given.exit_code == 0
    [warning] = [line for line in bare.stderr.splitlines() if line.startswith("warning: ")]
    assert "--registry" in warning and "Docker Hub" in warning
    assert "warning" not in given.stderr and "image: ghcr.io/o/trtllm-serve:25.01-" in given.stdout


def test_kserve_command_takes_a_users_own_image(tmp_path):
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    image = "registry.example.com/team/llm-server:prod"
    result = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--image", image])
    assert result.exit_code == 0, result.output
    (runtime, *_) = yaml.safe_load_all(result.output)
    assert runtime["spec"]["containers"][0]["image"] == image


def test_the_service_scales_on_the_queue_compute_ratio_of_its_stages(entry):
    options = kserve.KServeOptions(
        tag="25.01",
        model_id=HUB_MODEL,
        name="chat",
        namespace="team-a",
        min_replicas=2,
        max_replicas=6,
        scale_target=0.5,
        scale_down_window=900,
        prometheus_url="http://prom.obs.svc:9090",
    )
    docs = documents(options)
    isvc = by_kind(docs, "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 6)
    (metric,) = predictor["autoScaling"]["metrics"]
    assert metric["type"] == "External"
    external = metric["external"]
    assert external["metric"]["backend"] == "prometheus"
    assert external["metric"]["serverAddress"] == "http://prom.obs.svc:9090"
    # The formula the real-server test applies to Triton's /metrics, over this service's pods.
    assert external["metric"]["query"] == scaling.query(
        scaling.ENGINE_STAGES, {"namespace": "team-a", "pod": "chat-predictor-.*"}
    )
    assert 'model=~"preprocessing|tensorrt_llm|postprocessing"' in external["metric"]["query"]
    assert external["target"] == {"type": "Value", "value": "500m"}
    assert predictor["autoScaling"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 900}}
    # Prometheus scrapes Triton's metrics port of exactly these pods.
    assert {"name": "metrics", "containerPort": 8002, "protocol": "TCP"} in predictor["model"]["ports"]
    monitor = by_kind(docs, "PodMonitor")
    assert monitor["metadata"]["namespace"] == "team-a"
    assert monitor["spec"]["selector"] == {"matchLabels": {"serving.kserve.io/inferenceservice": "chat"}}
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]


def test_a_fixed_replica_count_renders_no_autoscaler(entry):
    isvc = by_kind(
        documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, min_replicas=3, max_replicas=3)),
        "InferenceService",
    )
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (3, 3) and "autoScaling" not in predictor
    assert "serving.kserve.io/autoscalerClass" not in isvc["metadata"]["annotations"]


def test_an_llmapi_image_scales_on_its_one_model(the_matrix):
    """The LLM-API repository has one model, renamed after the service: the ratio is that model's."""
    llmapi = [e for e in the_matrix.supported() if e.default_workflow == "llmapi"]
    if not llmapi:
        pytest.skip("no supported tag defaults to the LLM-API workflow")
    options = kserve.KServeOptions(tag=llmapi[0].tag, model_id=HUB_MODEL, max_replicas=2)
    isvc = by_kind(documents(options), "InferenceService")
    query = isvc["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]["metric"]["query"]
    assert 'model=~"llm"' in query


def test_the_matrix_default_workflow_is_the_entrypoints(the_matrix, tmp_path):
    from trtllm_entrypoint import image_facts

    for entry in the_matrix.entries:
        image = image_facts.ImageFacts(
            tag=entry.tag,
            tensorrt_llm="0",
            tensorrt=None,
            triton=None,
            workflows=entry.workflows,
            engine_deprecated=entry.engine_deprecated,
            openai_frontend=False,
            app_dir=tmp_path,
        )
        assert image.default_workflow == entry.default_workflow, entry.tag


def test_a_two_node_group_is_a_leader_worker_set(entry):
    docs = documents(MULTINODE_OPTIONS)
    assert [d["kind"] for d in docs] == [
        "PersistentVolumeClaim",
        "LeaderWorkerSet",
        "Service",
        "NetworkPolicy",
        "PodMonitor",
        "ScaledObject",
    ]
    lws = by_kind(docs, "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["replicas"] == 1 and lws["spec"]["networkConfig"] == {"subdomainPolicy": "Shared"}
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    for container in (leader, worker):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TP_SIZE"] == "16" and container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert {"name": "mpi-ssh", "mountPath": "/etc/trtllm-images/mpi-ssh", "readOnly": True} in container[
            "volumeMounts"
        ]
        assert container["securityContext"]["runAsNonRoot"] is True
    # Both roles run the group image (build.py --multinode): the server plus OpenSSH.
    assert leader["image"] == worker["image"] == "ghcr.io/your-org/trtllm-serve-group:25.01-trtllm-0.17.0"
    assert [p["containerPort"] for p in leader["ports"]] == [8000, 8001, 8002]
    assert [p["containerPort"] for p in worker["ports"]] == [2222]
    assert worker["readinessProbe"] == {"tcpSocket": {"port": 2222}, "periodSeconds": 10}
    assert leader["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert "TRITON_ADMIN_KEY" in {e["name"] for e in leader["env"]} - {e["name"] for e in worker["env"]}
    volumes = {v["name"]: v for v in template["workerTemplate"]["spec"]["volumes"]}
    assert volumes["mpi-ssh"]["secret"] == {"secretName": "llm-mpi-ssh", "defaultMode": 0o400}
    assert volumes["trtllm-cache"]["persistentVolumeClaim"]["claimName"] == "llm-trtllm-cache"
    assert by_kind(docs, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]

    service = by_kind(docs, "Service")
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": "llm", "role": "leader"}
    assert [p["port"] for p in service["spec"]["ports"]] == [8000, 8001, 8002]
    assert template["leaderTemplate"]["metadata"]["labels"]["role"] == "leader"

    policy = by_kind(docs, "NetworkPolicy")["spec"]
    assert policy["ingress"][0] == {
        "from": [{"podSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "llm"}}}]
    }
    assert 2222 not in [p["port"] for p in policy["ingress"][1]["ports"]]

    scaled = by_kind(docs, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "llm",
    }
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    assert trigger["metadata"]["query"] == scaling.query(
        scaling.ENGINE_STAGES, {"namespace": "default", "pod": "llm-[0-9]+"}
    )
    assert float(trigger["metadata"]["threshold"]) == 1.0
    assert scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 600
    }


def test_a_group_runs_an_image_given_with_image_as_is():
    options = dataclasses.replace(MULTINODE_OPTIONS, registry=None, image="registry.local/own-with-sshd:1")
    lws = by_kind(documents(options), "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    images = {t["spec"]["containers"][0]["image"] for t in (lws["leaderTemplate"], lws["workerTemplate"])}
    assert images == {"registry.local/own-with-sshd:1"}


def test_a_group_on_the_plain_server_image_is_a_finding(the_matrix):
    """Its workers need sshd: only the group image build.py makes (--multinode) passes as a default image."""
    docs = copy.deepcopy(list(documents(MULTINODE_OPTIONS)))
    assert kserve_findings.semantic_findings(docs, the_matrix) == []
    worker = by_kind(docs, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    worker["spec"]["containers"][0]["image"] = "ghcr.io/your-org/trtllm-serve:25.01-trtllm-0.17.0"
    (finding,) = kserve_findings.semantic_findings(docs, the_matrix)
    assert finding.startswith("LeaderWorkerSet/llm: workerTemplate: image 'ghcr.io/your-org/trtllm-serve:"), finding


def test_a_group_whose_pods_cannot_hold_its_ranks_is_a_finding(entry):
    docs = copy.deepcopy(list(documents(MULTINODE_OPTIONS)))
    lws = by_kind(docs, "LeaderWorkerSet")
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"
    ] = "4"
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "None"
    findings = " ".join(kserve_findings.semantic_findings(docs))
    assert "workerTemplate: 2 pods x 4 GPUs do not hold TP_SIZE*PP_SIZE = 16 ranks" in findings
    assert "RecreateGroupOnPodRestart" in findings


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_replicas": 0}, "--max-replicas must be an integer of at least 1"),
        ({"min_replicas": 3, "max_replicas": 2}, "--max-replicas 2 is below --min-replicas 3"),
        ({"scale_target": 0}, "--scale-target must be a ratio"),
        ({"scale_down_window": -1}, "--scale-down-window must be an integer of at least 0"),
        ({"prometheus_url": "prometheus:9090"}, "is not an http(s) URL"),
        ({"nodes": 0}, "nodes must be an integer of at least 1"),
        ({"nodes": 3, "tp_size": 8}, "cannot be split evenly over --nodes 3"),
        ({"nodes": 2, "tp_size": 8, "ssh_secret": "Bad_Name"}, "--ssh-secret 'Bad_Name'"),
    ],
)
def test_bad_scale_out_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as info:
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, **kwargs)
    assert message in info.value.message and info.value.exit_code == 2


def test_a_group_reads_its_model_by_id_and_has_no_warm_job():
    with pytest.raises(UsageError, match="reads its model by --model-id"):
        kserve.KServeOptions(tag="25.01", storage_uri="s3://b/m", nodes=2, tp_size=8)
    with pytest.raises(UsageError, match="--warm-job is for single-node"):
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, nodes=2, tp_size=8, cache="pvc", warm_job=True)


# Shared caches: every class of pods that mount one PVC at once, against each access mode.
SHARING = {
    "one pod": ({}, False),
    "replicas": ({"max_replicas": 4}, True),
    "fixed replicas": ({"min_replicas": 2, "max_replicas": 2}, True),
    "warm job": ({"warm_job": True}, True),
    "group": ({"nodes": 2, "tp_size": 16}, True),
    "autoscaled groups": ({"nodes": 2, "tp_size": 16, "max_replicas": 3}, True),
    "replicas and warm job": ({"max_replicas": 4, "warm_job": True}, True),
}


@pytest.mark.parametrize("case", SHARING)
@pytest.mark.parametrize("mode", kserve_checks.ACCESS_MODES)
def test_a_cache_pvc_that_several_pods_mount_is_read_write_many(case, mode):
    """Pods that may sit on different nodes cannot share a ReadWriteOnce volume: such a PVC is refused with one line
    naming what to pass; ReadWriteMany is written as asked; one pod alone may have ReadWriteOnce."""
    more, shared = SHARING[case]
    options = {"tag": "25.01", "model_id": HUB_MODEL, "cache": "pvc", "pvc_access_mode": mode, **more}
    if shared and mode == "ReadWriteOnce":
        with pytest.raises(UsageError) as info:
            kserve.KServeOptions(**options)
        message = info.value.message
        assert "\n" not in message and "--pvc-access-mode ReadWriteMany" in message, message
        assert "--pvc-storage-class" in message and "--cache emptydir" in message, message
        # The same options on a per-pod cache need no shared volume.
        documents(kserve.KServeOptions(**{**options, "cache": "emptydir", "warm_job": False}))
        return
    docs = documents(kserve.KServeOptions(**options))
    pvc = by_kind(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == [mode]
    claims = [v for pod in _pod_specs(docs) for v in pod["volumes"] if v["name"] == "trtllm-cache"]
    assert claims and all(v["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"] for v in claims)
    isvc = next((d for d in docs if d["kind"] == "InferenceService"), None)
    if isvc is not None:  # one pod at a time on a ReadWriteOnce cache, in a rollout too
        strategy = isvc["spec"]["predictor"].get("deploymentStrategy")
        assert strategy == ({"type": "Recreate"} if mode == "ReadWriteOnce" else None)


def test_the_cache_refusal_is_one_line_from_the_command(tmp_path):
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    args = ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--nodes", "2", "--tp-size", "16", "--cache", "pvc"]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.stderr.count("\n") == 2, result.output
    assert "the 2 pods of each group" in result.stderr and "--pvc-access-mode ReadWriteMany" in result.stderr
    assert not (tmp_path / "out").exists()
    storage_class = ["--pvc-access-mode", "ReadWriteMany", "--pvc-storage-class", "cephfs"]
    result = CliRunner().invoke(cli, [*args, *storage_class])
    pvc = next(d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"] == "cephfs"


def _pod_specs(docs):
    """Every pod template the documents carry: the predictor, the warm Job's, a group's leader and worker."""
    for doc in docs:
        if doc["kind"] == "InferenceService":
            yield doc["spec"]["predictor"]
        elif doc["kind"] == "Job":
            yield doc["spec"]["template"]["spec"]
        elif doc["kind"] == "LeaderWorkerSet":
            template = doc["spec"]["leaderWorkerTemplate"]
            yield template["leaderTemplate"]["spec"]
            yield template["workerTemplate"]["spec"]


def _containers(pod):
    return [pod["model"]] if "model" in pod else pod["containers"]


@pytest.mark.parametrize(
    "options",
    [KNOBS_OPTIONS, dataclasses.replace(MULTINODE_OPTIONS, **KNOBS)],
    ids=["service-and-warm-job", "group"],
)
def test_every_pod_gets_the_cluster_settings(options, crd_validators):
    """Placement, identity, extra environment and resources reach every pod alike: a warm Job on another GPU model
    than its service would build an engine the service cannot run."""
    docs = documents(options)
    pods = list(_pod_specs(docs))
    assert len(pods) == 2  # the predictor and the warm Job, or the leader and the worker
    for pod in pods:
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "llm"}
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoExecute"},
            {"key": "spot", "operator": "Exists"},
        ]
        assert pod["affinity"] == AFFINITY
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
        assert (pod["serviceAccountName"], pod["priorityClassName"]) == ("llm-serving", "high-priority")
        for container in _containers(pod):
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert (env["MAX_BATCH_SIZE"], env["NCCL_DEBUG"]) == ("64", "INFO")
            assert env["TP_SIZE"] == str(options.tp_size)  # the generator's own variables stay
            resources = container["resources"]
            gpus = resources["limits"]["nvidia.com/gpu"]
            assert resources["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpus}
            assert resources["limits"] == {"cpu": "16", "memory": "96Gi", "nvidia.com/gpu": gpus}
    for doc in docs:
        assert validation_errors(doc, crd_validators) == [], doc["kind"]
    assert kserve_findings.semantic_findings(docs, _matrix()) == []


def test_resources_default_to_a_memory_limit_and_no_cpu_limit():
    """A namespace with a memory quota needs limits; a CPU limit would throttle tokenization, so none unless asked."""
    model = _isvc_model(documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL)))
    assert model["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
    }
    pod = next(_pod_specs(documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL))))
    assert not {"nodeSelector", "tolerations", "affinity", "imagePullSecrets", "serviceAccountName"} & set(pod)


BAD_KNOBS = [
    ({"node_selector": ("gpu",)}, "--node-selector 'gpu' is not KEY=VALUE"),
    ({"node_selector": ("bad key=x",)}, "--node-selector 'bad key=x'"),
    ({"tolerations": ("gpu:Sometimes",)}, "--toleration 'gpu:Sometimes' has effect 'Sometimes'"),
    ({"tolerations": ("=x:NoSchedule",)}, "--toleration '=x:NoSchedule' is not KEY[=VALUE][:EFFECT]"),
    ({"affinity": "{nodeAffinity: 1}"}, "--affinity is not JSON"),
    ({"affinity": '{"nodeAffinty": {}}'}, "--affinity has nodeAffinty"),
    ({"affinity": '{"nodeAffinity": []}'}, "--affinity nodeAffinity must be a JSON object"),
    ({"image_pull_secrets": ("Reg_Cred",)}, "--image-pull-secret 'Reg_Cred' must be a DNS subdomain"),
    ({"service_account": "LLM"}, "--service-account 'LLM'"),
    ({"priority_class": "a b"}, "--priority-class 'a b'"),
    ({"env": ("NOVALUE",)}, "--env 'NOVALUE' is not NAME=VALUE"),
    ({"env": ("1X=2",)}, "--env '1X=2' is not NAME=VALUE"),
    ({"env": ("TP_SIZE=4",)}, "--env 'TP_SIZE=4' is set by the generator (use --tp-size)"),
    ({"env": ("CACHE_DIR=/x",)}, "--env 'CACHE_DIR=/x' is set by the generator"),
    ({"env": ("LWS_GROUP_SIZE=2",)}, "is set by the generator"),
    ({"env": ("WANDB_API_KEY=abc",)}, "looks like a secret"),
    ({"env": ("A=1", "A=2")}, "--env A is given twice"),
    ({"cpu": "lots"}, "--cpu 'lots' is not a CPU quantity"),
    ({"cpu": "0"}, "--cpu '0' is not a CPU quantity above zero"),
    ({"memory": "32GB"}, "--memory '32GB' is not a memory quantity"),
    ({"cpu_limit": "2"}, "--cpu-limit 2 is below the request --cpu 4"),
    ({"memory_limit": "16Gi"}, "--memory-limit 16Gi is below the request --memory 32Gi"),
    ({"pvc_storage_class": "nfs"}, "--pvc-storage-class needs --cache pvc"),
    ({"pvc_storage_class": "NFS", "cache": "pvc"}, "--pvc-storage-class 'NFS' must be a DNS subdomain"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_KNOBS)
def test_bad_cluster_settings_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as info:
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, **kwargs)
    assert message in info.value.message and info.value.exit_code == 2, info.value.message


def test_option_errors_name_flags_the_command_has():
    """Every refusal names what the user typed (`--tp-size`), never a field of the options (`tp_size`)."""
    from trtllm_images.cli import cli

    flags = {opt for param in cli.commands["kserve"].params for opt in param.opts}
    cases = [
        {"model_id": HUB_MODEL, "tp_size": 3, "pp_size": 0, "cache": "x", "pvc_access_mode": "x", "frontend": "x"},
        {"storage_uri": "pvc://a/../b", "model_id": HUB_MODEL, "name": "1a", "namespace": "A", "pvc_size": "0"},
        {"model_id": HUB_MODEL, "image": "A B", "registry": "x y", "warm_job": True, "hf_token_secret": "A"},
        {"model_id": HUB_MODEL, "min_replicas": 0, "max_replicas": 0, "nodes": 0, "scale_down_window": -1},
        {"model_id": HUB_MODEL, "scale_target": 0, "prometheus_url": "x", "ssh_secret": "A", "admin_key_secret": "A"},
        {"storage_uri": "s3://b/m", "nodes": 3, "tp_size": 8, "warm_job": True, "cache": "pvc", "name": "a" * 41},
        *(dict(kwargs, model_id=HUB_MODEL) for kwargs, _ in BAD_KNOBS),
    ]
    fields = {f.name for f in dataclasses.fields(kserve.KServeOptions) if "_" in f.name}
    for kwargs in cases:
        with pytest.raises(UsageError) as info:
            kserve.KServeOptions(tag="25.01", **kwargs)
        message = info.value.message
        named = set(re.findall(r"--[a-z][a-z0-9-]*", message))
        assert named and named <= flags, (named - flags, message)
        assert not {field for field in fields if re.search(rf"\b{field}\b", message)}, message


def _kserve_blocks(path):
    """The bash blocks of a document that run `build.py kserve … --out DIR`."""
    text = path.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        if "build.py kserve" in block and "--out" in block:
            yield block


@pytest.mark.parametrize("document", ["README.md", "docs/kserve.md"])
def test_every_kserve_quick_start_applies_every_file_it_writes(document, tmp_path):
    """Run each documented `build.py kserve … --out DIR` and check the same block applies every file it wrote."""
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    blocks = list(_kserve_blocks(REPO / document))
    assert blocks, f"{document} has no build.py kserve command with --out"
    for block in blocks:
        joined = block.replace("\\\n", " ")
        (command,) = [line for line in joined.splitlines() if "build.py kserve" in line]
        args = shlex.split(command.split("#", 1)[0].replace("<you>", "you").replace("<rwx-class>", "nfs"))
        args = args[args.index("kserve") :]
        out = args[args.index("--out") + 1].rstrip("/")
        result = CliRunner().invoke(cli, [*args[: args.index("--out")], "--out", str(tmp_path / out)])
        assert result.exit_code == 0, (command, result.output)
        written = {p.name for p in (tmp_path / out).iterdir()}
        applied = set(re.findall(rf"-f {re.escape(out)}/([\w.-]+\.yaml)", joined))
        assert written == applied, (document, command, written ^ applied)
