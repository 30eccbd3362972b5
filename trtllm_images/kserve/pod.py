"""The pieces every generated pod is made of, whether KServe runs it (kserve.py) or a LeaderWorkerSet group does
(multinode.py): labels, environment, resources, placement, security context, probes, volumes, the PodMonitor, and the
image a pod runs. Pure: options in, dicts out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.contract import DEFAULT_CACHE_DIR, UID
from trtllm_images.kserve.checks import toleration
from trtllm_images.kserve.options import KServeOptions
from trtllm_images.plan import make_build_plan

if TYPE_CHECKING:
    from trtllm_images.matrix import MatrixEntry

# KServe's HTTP default; gRPC on Triton's own port, as under Docker: 9000 is only ever the OpenAI API (OPENAI_PORT).
HTTP_PORT, GRPC_PORT = 8080, contract.DEFAULT_GRPC_PORT
GPU = "nvidia.com/gpu"
STARTUP_BUDGET_SECONDS = 2 * 3600  # a cold engine build of a large model
STARTUP_PERIOD_SECONDS = 30
_TRITON_PATHS = (contract.READY_PATHS["triton"], "/v2/health/live")  # readiness, liveness
CACHE_VOLUME, SHM_VOLUME, ADAPTERS_VOLUME = "trtllm-cache", "devshm", "lora-adapters"
TOKEN_KEY = "token"
ADMIN_KEY_KEY = "key"  # key of the admin-key Secret (Triton's restricted APIs, README "Security")
PART_OF = {"app.kubernetes.io/part-of": "trtllm-images"}
METRICS_PORT_NAME = "metrics"
SCRAPE_INTERVAL = "15s"


def server_image(entry: MatrixEntry, registry: str | None = None, kind: str = "server") -> str:
    """The image a pod runs: "server", or "group" (the server plus OpenSSH, `build.py --multinode`) in a group."""
    # The plan is the one place that names images; out_dir is irrelevant to the ref.
    plan = make_build_plan(entry, registry=registry, out_dir=Path("."), multinode=kind == "group")
    return plan.image(kind).ref


def meta(name: str, namespace: str | None, annotations: dict | None = None) -> dict:
    fields = {"name": name, "namespace": namespace, "labels": dict(PART_OF), "annotations": annotations}
    return {key: value for key, value in fields.items() if value}


def env_list(pairs: dict[str, Any]) -> list[dict]:
    return [{"name": key, "value": str(value)} for key, value in pairs.items() if value is not None]


def gpu_resources(o: KServeOptions, gpus: int) -> dict:
    """CPU and memory requests, a memory limit (no CPU limit unless asked: it throttles tokenization), the GPUs."""
    limits = {"cpu": o.cpu_limit, "memory": o.memory_limit_value, GPU: str(gpus)}
    return {
        "requests": {"cpu": o.cpu, "memory": o.memory, GPU: str(gpus)},
        "limits": {key: value for key, value in limits.items() if value is not None},
    }


def pod_settings(o: KServeOptions) -> dict:
    """Where and as whom every pod runs (the service's, the warm Job's, a group's): the same for all, so the Job
    builds its engine on the GPU model the service runs it on."""
    pairs = [item.partition("=") for item in o.node_selector]
    settings = {
        "nodeSelector": {key: value for key, _, value in pairs},
        "tolerations": [toleration(item) for item in o.tolerations],
        "affinity": json.loads(o.affinity) if o.affinity else None,
        "imagePullSecrets": [{"name": name} for name in o.image_pull_secrets],
        "serviceAccountName": o.service_account,
        "priorityClassName": o.priority_class,
    }
    return {key: value for key, value in settings.items() if value}


def security_context() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def probe(path: str | None, period: int, failures: int, port: int) -> dict:
    """An HTTP GET of `path` on `port`; None: the port accepting connections (the OpenAI frontend has no liveness
    route, and its readiness would restart a pod that is only busy loading)."""
    check = {"httpGet": {"path": path, "port": port}} if path else {"tcpSocket": {"port": port}}
    return {**check, "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": failures}


def serving_probes(frontend: str, port: int = HTTP_PORT) -> dict:
    """Startup (a cold engine build's budget), readiness and liveness of a serving container on its HTTP `port`."""
    ready, live = (contract.READY_PATHS["openai"], None) if frontend == "openai" else _TRITON_PATHS
    return {
        "startupProbe": probe(ready, STARTUP_PERIOD_SECONDS, STARTUP_BUDGET_SECONDS // STARTUP_PERIOD_SECONDS, port),
        "readinessProbe": probe(ready, 10, 3, port),
        "livenessProbe": probe(live, 30, 4, port),
    }


def model_env(o: KServeOptions) -> list[dict]:
    """What decides the engine: shared by the service and the warm Job, so both compute the same cache key."""
    env = env_list(
        {
            "MODEL_ID": o.model_id,
            "MODEL_REVISION": o.model_revision,
            "CACHE_DIR": DEFAULT_CACHE_DIR,
            "TP_SIZE": o.tp_size,
            "PP_SIZE": o.pp_size,
        }
    )
    if o.adapters:  # the adapters are part of what is prepared: the warm Job converts them as the service would
        env += env_list({"LORA_DIR": contract.KSERVE_ADAPTERS_DIR, "WORKFLOW": "engine"})
    env += [{"name": name, "value": value} for name, _, value in (item.partition("=") for item in o.env)]
    if o.model_id and o.hf_token_secret:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": o.hf_token_secret, "key": TOKEN_KEY, "optional": True}},
            }
        )
    return env


def admin_key_env(o: KServeOptions) -> list[dict]:
    """Only the serving pod opens Triton's restricted APIs; the warm Job's `prepare` needs no key."""
    if not o.admin_key_secret:
        return []
    return [
        {
            "name": "TRITON_ADMIN_KEY",
            "valueFrom": {"secretKeyRef": {"name": o.admin_key_secret, "key": ADMIN_KEY_KEY, "optional": True}},
        }
    ]


def shm_volume() -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{contract.SHM_SIZE_GIB}Gi"}}


def cache_volume(o: KServeOptions) -> dict:
    if o.cache == "pvc":
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": o.claim}}
    return {"name": CACHE_VOLUME, "emptyDir": {}}


def pod_monitor(o: KServeOptions, name: str, labels: dict[str, str], front_port: str | None = None) -> dict:
    """How Prometheus (through the Prometheus Operator) scrapes the serving pods: Triton's metrics port, and with
    --frontend openai the front's own /metrics on `front_port` (its LLM metrics, docs/metrics.md)."""
    endpoints = [{"port": METRICS_PORT_NAME, "path": "/metrics", "interval": SCRAPE_INTERVAL}]
    if o.frontend == "openai" and front_port is not None:
        endpoints.append({"port": front_port, "path": "/metrics", "interval": SCRAPE_INTERVAL})
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(name, o.namespace),
        "spec": {"selector": {"matchLabels": labels}, "podMetricsEndpoints": endpoints},
    }


def adapters_volume(o: KServeOptions) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts) for --adapters: its claim, read-only, at contract.KSERVE_ADAPTERS_DIR (LORA_DIR)."""
    if not o.adapters:  # validated: pvc://<claim>[/<path>]
        return [], []
    claim, _, sub_path = o.adapters[len("pvc://") :].partition("/")
    mount = {"name": ADAPTERS_VOLUME, "mountPath": contract.KSERVE_ADAPTERS_DIR, "readOnly": True}
    if sub_path:
        mount["subPath"] = sub_path
    return [{"name": ADAPTERS_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}], [mount]
