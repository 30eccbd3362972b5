"""What `build.py kserve` generates: the runtime's contract with the entrypoint, the InferenceService, secrets, the
cache PVC and warm-up Job, images, cluster settings and resources."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from tests.unit.kserve.kserve_documents import (
    AFFINITY,
    AUTOSCALED_OPTIONS,
    DEPLOY_OPTIONS,
    HUB_MODEL,
    KNOBS,
    KNOBS_OPTIONS,
    MULTINODE_OPTIONS,
    by_kind,
    documents,
    isvc_model,
    load_matrix,
    validation_errors,
)
from trtllm_entrypoint.errors import UsageError
from trtllm_images.kserve import checks as kserve_checks
from trtllm_images.kserve import findings as kserve_findings
from trtllm_images.kserve import plan as kserve
from trtllm_images.plan import make_build_plan


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


def test_unsupported_tag_is_refused(the_matrix):
    unsupported = next(e for e in the_matrix.entries if not e.supported)
    for image in (None, "registry.local/custom:1"):
        with pytest.raises(UsageError, match="not supported"):
            kserve.make_kserve_plan(
                the_matrix, kserve.KServeOptions(tag=unsupported.tag, model_id=HUB_MODEL, image=image)
            )


def test_printing_and_files_render_the_same_plan(the_matrix):
    plan = kserve.make_kserve_plan(the_matrix, DEPLOY_OPTIONS)
    files = kserve.render_files(plan)
    header = files["runtime.yaml"].split("---", 1)[0]
    assert header.startswith("# Generated by: python build.py kserve")
    assert kserve.render_manifests(plan).startswith(header)
    assert list(yaml.safe_load_all(kserve.render_manifests(plan))) == list(plan.documents)
    assert [doc for text in files.values() for doc in yaml.safe_load_all(text)] == list(plan.documents)


def test_write_files_leaves_no_temp_files(tmp_path, entry):
    files = kserve.render_files(kserve.make_kserve_plan(load_matrix(), DEPLOY_OPTIONS))
    written = kserve.write_files(tmp_path / "out", files)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(files) == sorted(p.name for p in written)
    assert all(p.read_text() == files[p.name] for p in written)


def test_the_matrix_default_workflow_is_the_entrypoints(the_matrix, tmp_path):
    from trtllm_entrypoint.config import image_facts

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
    assert kserve_findings.semantic_findings(docs, load_matrix()) == []


def test_resources_default_to_a_memory_limit_and_no_cpu_limit():
    """A namespace with a memory quota needs limits; a CPU limit would throttle tokenization, so none unless asked."""
    model = isvc_model(documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL)))
    assert model["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
    }
    pod = next(_pod_specs(documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL))))
    assert not {"nodeSelector", "tolerations", "affinity", "imagePullSecrets", "serviceAccountName"} & set(pod)


def test_the_openai_example_request_names_the_model_as_the_runtime_serves_it(the_matrix):
    """SERVED_MODEL_NAME={{.Name}}: the service's name is the model on the OpenAI API, and the files say how to ask."""
    options = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, frontend="openai", name="chat")
    plan = kserve.make_kserve_plan(the_matrix, options)
    runtime, service = (
        by_kind(list(plan.documents), "ClusterServingRuntime"),
        by_kind(list(plan.documents), "InferenceService"),
    )
    env = {e["name"]: e["value"] for e in runtime["spec"]["containers"][0]["env"]}
    assert env["SERVED_MODEL_NAME"] == "{{.Name}}" and service["metadata"]["name"] == "chat"
    header = kserve.render_manifests(plan).split("---", 1)[0]
    assert "svc/chat-predictor" in header and '"model": "chat"' in header and "/v1/chat/completions" in header
    triton = kserve.make_kserve_plan(the_matrix, dataclasses.replace(options, frontend="triton"))
    assert "/v1/chat/completions" not in triton.header
