"""KServe manifests for a server image: a (Cluster)ServingRuntime, an example InferenceService, an optional cache PVC
and a Job that warms it. Pure: options in, a KServePlan out, YAML rendered from it (`write_files` is the only I/O);
docs/kserve.md says why.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtllm_entrypoint import contract
from trtllm_entrypoint.contract import DEFAULT_CACHE_DIR, DEFAULT_METRICS_PORT, KSERVE_MODEL_DIR, UID
from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import multinode, scaling
from trtllm_images.files import write_atomic
from trtllm_images.kserve_options import KServeOptions, flag, toleration
from trtllm_images.plan import make_plan as make_build_plan

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix, MatrixEntry

CONTAINER = "kserve-container"  # KServe refuses a runtime without a container of this name
MODEL_FORMAT = "tensorrt-llm"  # our own format, so auto-selection never competes with kserve-tritonserver
PROTOCOLS = ("v2", "grpc-v2")  # --frontend openai declares none: the OpenAI API is none of KServe's protocols
KNOWN_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
HTTP_PORT, GRPC_PORT = 8080, 9000  # KServe's HTTP default; gRPC as its stock Triton runtime
GPU = "nvidia.com/gpu"
STARTUP_BUDGET_SECONDS = 2 * 3600  # a cold engine build of a large model
STARTUP_PERIOD_SECONDS = 30
_TRITON_PATHS = (contract.READY_PATHS["triton"], "/v2/health/live")  # readiness, liveness
CACHE_VOLUME, SHM_VOLUME, MODELS_VOLUME = "trtllm-cache", "devshm", "models"
TOKEN_KEY = "token"
ADMIN_KEY_KEY = "key"  # key of the admin-key Secret (Triton's restricted APIs, README "Security")
PART_OF = {"app.kubernetes.io/part-of": "trtllm-images"}
METRICS_PORT_NAME = "metrics"
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe puts it on every predictor pod
SCRAPE_INTERVAL = "15s"

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|KEY)", re.IGNORECASE)
_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}")


def server_image(entry: MatrixEntry, registry: str | None = None, kind: str = "server") -> str:
    """The image a pod runs: "server", or "group" (the server plus OpenSSH, `build.py --multinode`) in a group."""
    # The plan is the one place that names images; out_dir is irrelevant to the ref.
    plan = make_build_plan(entry, registry=registry, out_dir=Path("."), multinode=kind == "group")
    return plan.image(kind).ref


def runtime_name(tag: str, frontend: str = "triton") -> str:
    """One runtime per tag and frontend, so a cluster can hold both."""
    return "trtllm-" + tag.replace(".", "-") + ("-openai" if frontend == "openai" else "")


@dataclass(frozen=True)
class KServePlan:
    """Everything `build.py kserve` outputs, decided once: printing and writing files both render this value."""

    documents: tuple[dict, ...]  # runtime, [PVC], InferenceService, [warm Job]: the order `kubectl apply` needs
    header: str  # stamped into every output: the command that regenerates it


def make_plan(matrix: Matrix, options: KServeOptions) -> KServePlan:
    """The manifests for options.tag, refused if they break a rule of KServe's that the CRD schemas cannot say."""
    entry = matrix.get(options.tag)
    # Also refuses unsupported tags, even with --image. A group's pods start ranks over ssh: the group image.
    default_image = server_image(entry, options.registry, "group" if options.nodes > 1 else "server")
    if options.frontend == "openai" and not entry.openai_frontend:
        first = next((e.tag for e in matrix.supported() if e.openai_frontend), None)
        raise UsageError(
            f"--frontend openai: image {entry.tag} has no Triton OpenAI frontend",
            f"use --tag {first} or later" if first else "use --frontend triton",
        )
    image = options.image or default_image
    if options.nodes > 1:  # KServe's multi-node path is Ray's: a LeaderWorkerSet instead (docs/kserve.md)
        documents = [_pvc(options)] if options.cache == "pvc" else []
        documents += multinode.documents(options, image, entry.default_workflow)
    else:
        documents = [_runtime(entry, options, image)]
        if options.cache == "pvc":
            documents.append(_pvc(options))
        documents.append(_inference_service(options, entry.default_workflow))
        if options.autoscaled:  # the autoscaler's data; it needs the Prometheus Operator (docs/kserve.md)
            documents.append(pod_monitor(options, f"{options.name}-triton", {ISVC_LABEL: options.name}))
        if options.warm_job:
            documents.append(_warm_job(options, image))
    # An image given with --image is the user's own; only the default one must be an image build.py makes.
    problems = semantic_findings(documents, None if options.image else matrix)
    if problems:  # what KServe's webhooks would reject later, refused before anything is written
        raise Error(
            "the manifests break KServe's rules: " + "; ".join(problems),
            "a combination of options this generator does not handle: please report it",
        )
    header = (
        f"Generated by: {command_line(options)}\n"
        "Change the options and regenerate rather than edit (regenerating replaces this file); docs/kserve.md\n"
        "lists the options, placement and resources included."
    )
    return KServePlan(documents=tuple(documents), header=header)


def _meta(name: str, namespace: str | None, annotations: dict | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": dict(PART_OF), "annotations": annotations}
    return {key: value for key, value in meta.items() if value}


def _env(pairs: dict[str, Any]) -> list[dict]:
    return [{"name": key, "value": str(value)} for key, value in pairs.items() if value is not None]


def _resources(o: KServeOptions, gpus: int) -> dict:
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


def _security_context() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _probe(path: str | None, period: int, failures: int, port: int) -> dict:
    """An HTTP GET of `path` on `port`; None: the port accepting connections (the OpenAI frontend has no liveness
    route, and its readiness would restart a pod that is only busy loading)."""
    check = {"httpGet": {"path": path, "port": port}} if path else {"tcpSocket": {"port": port}}
    return {**check, "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": failures}


def serving_probes(frontend: str, port: int = HTTP_PORT) -> dict:
    """Startup (a cold engine build's budget), readiness and liveness of a serving container on its HTTP `port`."""
    ready, live = (contract.READY_PATHS["openai"], None) if frontend == "openai" else _TRITON_PATHS
    return {
        "startupProbe": _probe(ready, STARTUP_PERIOD_SECONDS, STARTUP_BUDGET_SECONDS // STARTUP_PERIOD_SECONDS, port),
        "readinessProbe": _probe(ready, 10, 3, port),
        "livenessProbe": _probe(live, 30, 4, port),
    }


def _runtime(entry: MatrixEntry, o: KServeOptions, image: str) -> dict:
    openai = o.frontend == "openai"
    if openai:
        # The OpenAI API on KServe's HTTP port, tritonserver's metrics port beside it (what the autoscaler reads);
        # its KServe frontends stay off (the image's secure default): no gRPC port, Triton's protocols not offered.
        ports = {"FRONTEND": "openai", "OPENAI_PORT": HTTP_PORT, "METRICS_PORT": DEFAULT_METRICS_PORT}
    else:
        ports = {"HTTP_PORT": HTTP_PORT, "GRPC_PORT": GRPC_PORT, "METRICS_PORT": DEFAULT_METRICS_PORT}
    container = {
        "name": CONTAINER,
        "image": image,
        # No args: the image's ENTRYPOINT + CMD ["serve"] start Triton; ports and names come from the environment.
        "env": _env(
            {
                **ports,
                "CACHE_DIR": DEFAULT_CACHE_DIR,
                "SERVED_MODEL_NAME": "{{.Name}}",
                "TP_SIZE": o.tp_size,
                "PP_SIZE": o.pp_size,
            }
        ),
        # One port only: Knative rejects more, and KServe's Service sends port 80 to the first one.
        "ports": [{"name": "http1", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": _resources(o, o.gpus),
        **serving_probes(o.frontend),
        "securityContext": _security_context(),
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
    }
    metrics = {"prometheus.kserve.io/port": str(DEFAULT_METRICS_PORT), "prometheus.kserve.io/path": "/metrics"}
    spec = {
        "annotations": metrics,
        "supportedModelFormats": [
            {"name": MODEL_FORMAT, "version": entry.tensorrt_llm, "autoSelect": True, "priority": 1}
        ],
        # The OpenAI API is none of KServe's protocols (v1, v2, grpc-v1, grpc-v2): an OpenAI runtime lists none,
        # which KServe takes as accepting any, rather than claim v1 (its predict protocol).
        "protocolVersions": None if openai else list(PROTOCOLS),
        "containers": [container],
        "volumes": [_shm_volume()],
    }
    spec = {key: value for key, value in spec.items() if value is not None}
    kind = "ServingRuntime" if o.namespaced_runtime else "ClusterServingRuntime"
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": kind,
        "metadata": _meta(runtime_name(o.tag, o.frontend), o.namespace if o.namespaced_runtime else None),
        "spec": spec,
    }


def _model_env(o: KServeOptions) -> list[dict]:
    """What decides the engine: shared by the service and the warm Job, so both compute the same cache key."""
    env = _env(
        {
            "MODEL_ID": o.model_id,
            "MODEL_REVISION": o.model_revision,
            "CACHE_DIR": DEFAULT_CACHE_DIR,
            "TP_SIZE": o.tp_size,
            "PP_SIZE": o.pp_size,
        }
    )
    env += [{"name": name, "value": value} for name, _, value in (item.partition("=") for item in o.env)]
    if o.model_id and o.hf_token_secret:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": o.hf_token_secret, "key": TOKEN_KEY, "optional": True}},
            }
        )
    return env


def _admin_key_env(o: KServeOptions) -> list[dict]:
    """Only the serving pod opens Triton's restricted APIs; the warm Job's `prepare` needs no key."""
    if not o.admin_key_secret:
        return []
    return [
        {
            "name": "TRITON_ADMIN_KEY",
            "valueFrom": {"secretKeyRef": {"name": o.admin_key_secret, "key": ADMIN_KEY_KEY, "optional": True}},
        }
    ]


def _shm_volume() -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}  # NCCL outgrows 64 MB


def _cache_volume(o: KServeOptions) -> dict:
    if o.cache == "pvc":
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": o.claim}}
    return {"name": CACHE_VOLUME, "emptyDir": {}}


def _inference_service(o: KServeOptions, workflow: str) -> dict:
    annotations = {"serving.kserve.io/deploymentMode": "RawDeployment"}  # Standard from 0.16; this spelling: all
    if o.autoscaled:  # KServe then writes the KEDA ScaledObject itself
        annotations["serving.kserve.io/autoscalerClass"] = "keda"
    model: dict[str, Any] = {"modelFormat": {"name": MODEL_FORMAT}}
    if o.frontend == "triton":  # without it KServe assumes v1, which a Triton runtime does not offer
        model["protocolVersion"] = "v2"
    model["runtime"] = runtime_name(o.tag, o.frontend)
    if o.storage_uri:
        model["storageUri"] = o.storage_uri
        annotations["storage.kserve.io/readonly"] = "true" if o.storage_readonly else "false"
    model.update(
        {
            "env": _model_env(o) + _admin_key_env(o),
            # Both ports, HTTP first: raw deployments expose every declared port, the first one as the Service's
            # port 80.
            "ports": [{"name": "http1", "containerPort": HTTP_PORT, "protocol": "TCP"}]
            + ([] if o.frontend == "openai" else [{"name": "grpc-v2", "containerPort": GRPC_PORT, "protocol": "TCP"}])
            + [{"name": METRICS_PORT_NAME, "containerPort": DEFAULT_METRICS_PORT, "protocol": "TCP"}],
            "resources": _resources(o, o.gpus),
            "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": DEFAULT_CACHE_DIR}],
        }
    )
    predictor: dict[str, Any] = {"minReplicas": o.min_replicas, "maxReplicas": o.max_replicas}
    if o.autoscaled:
        # Raw deployments name their pods <name>-predictor-<hash>-<hash>.
        pods = {"namespace": o.namespace, "pod": f"{o.name}-predictor-.*"}
        predictor["autoScaling"] = autoscaling(o, scaling.stage_models(workflow, o.name), pods)
    if o.cache == "pvc" and o.pvc_access_mode == "ReadWriteOnce":
        # One pod at a time on a ReadWriteOnce cache, in a rollout too: a surge pod on another node would wait
        # for the volume while the old pod waits for it to become ready.
        predictor["deploymentStrategy"] = {"type": "Recreate"}
    predictor.update(
        {
            "terminationGracePeriodSeconds": contract.STOP_GRACE_SECS,  # longer than the server's drain
            "securityContext": {"fsGroup": UID},
            **pod_settings(o),
            "model": model,
            "volumes": [_cache_volume(o)],
        }
    )
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": _meta(o.name, o.namespace, annotations),
        "spec": {"predictor": predictor},
    }


def autoscaling(o: KServeOptions, models: tuple[str, ...], pods: dict[str, str]) -> dict:
    """KServe's `autoScaling` (KEDA class): scale while queue time exceeds `scale_target` x compute time."""
    metric = {
        "type": "External",
        "external": {
            "metric": {
                "backend": "prometheus",
                "serverAddress": o.prometheus_url,
                "query": scaling.query(models, pods),
            },
            # Value, not AverageValue: the query is already a per-replica average (a ratio of sums).
            "target": {"type": "Value", "value": scaling.quantity(o.scale_target)},
        },
    }
    return {
        "metrics": [metric],
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": o.scale_down_window}},
    }


def pod_monitor(o: KServeOptions, name: str, labels: dict[str, str]) -> dict:
    """How Prometheus (through the Prometheus Operator) scrapes Triton's metrics port of the serving pods."""
    endpoint = {"port": METRICS_PORT_NAME, "path": "/metrics", "interval": SCRAPE_INTERVAL}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(name, o.namespace),
        "spec": {"selector": {"matchLabels": labels}, "podMetricsEndpoints": [endpoint]},
    }


def _pvc(o: KServeOptions) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(o.claim, o.namespace),
        "spec": {
            "accessModes": [o.pvc_access_mode],
            **({"storageClassName": o.pvc_storage_class} if o.pvc_storage_class else {}),
            "resources": {"requests": {"storage": o.pvc_size}},
        },
    }


def _warm_job(o: KServeOptions, image: str) -> dict:
    mounts: list[dict[str, Any]] = [
        {"name": CACHE_VOLUME, "mountPath": DEFAULT_CACHE_DIR},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    volumes = [_cache_volume(o), _shm_volume()]
    if o.storage_uri:  # validated: pvc://<claim>[/<path>]
        claim, _, sub_path = o.storage_uri[len("pvc://") :].partition("/")
        mount = {"name": MODELS_VOLUME, "mountPath": KSERVE_MODEL_DIR, "readOnly": True}
        if sub_path:
            mount["subPath"] = sub_path
        mounts.append(mount)
        volumes.append({"name": MODELS_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    container = {
        "name": "prepare",
        "image": image,
        "args": ["prepare"],
        "env": _model_env(o),
        # Building an engine needs the same GPUs (and GPU model) as serving it.
        "resources": _resources(o, o.gpus),
        "securityContext": _security_context(),
        "volumeMounts": mounts,
    }
    pod = {
        "restartPolicy": "Never",
        "securityContext": {"fsGroup": UID},
        **pod_settings(o),
        "containers": [container],
        "volumes": volumes,
    }
    spec = {
        "backoffLimit": 1,
        "activeDeadlineSeconds": STARTUP_BUDGET_SECONDS,
        "ttlSecondsAfterFinished": 86400,
        "template": {"metadata": {"labels": dict(PART_OF)}, "spec": pod},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(f"{o.name}-warm-cache", o.namespace),
        "spec": spec,
    }


def command_line(options: KServeOptions) -> str:
    """The `build.py kserve` invocation that produces these options (stamped into generated files)."""
    argv = ["python", "build.py", "kserve"]
    for field in fields(KServeOptions):
        value = getattr(options, field.name)
        if value == field.default:
            continue
        if field.name == "hf_token_secret" and value is None:
            argv.append("--no-hf-token")
        elif field.name == "admin_key_secret" and value is None:
            argv.append("--no-admin-key")
        elif isinstance(value, bool):
            argv.append(flag(field.name))
        elif isinstance(value, tuple):  # a repeatable option
            argv += [part for item in value for part in (flag(field.name), item)]
        else:
            argv += [flag(field.name), str(value)]
    return shlex.join(argv)


def dump_yaml(docs: Iterable[dict], header: str = "") -> str:
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.safe_dump_all(
        list(docs), sort_keys=False, default_flow_style=False, width=120, explicit_start=True
    )


FILE_NAMES = {
    "ClusterServingRuntime": "runtime.yaml",
    "ServingRuntime": "runtime.yaml",
    "PersistentVolumeClaim": "cache-pvc.yaml",
    "InferenceService": "inferenceservice.yaml",
    "Job": "warm-cache-job.yaml",
    "PodMonitor": "podmonitor.yaml",
    "LeaderWorkerSet": "leaderworkerset.yaml",
    "Service": "leader-service.yaml",
    "ScaledObject": "autoscaler.yaml",
    "NetworkPolicy": "networkpolicy.yaml",
}


def render(plan: KServePlan) -> str:
    """All documents as one YAML stream (what `build.py kserve` prints without --out)."""
    return dump_yaml(plan.documents, plan.header)


def render_files(plan: KServePlan) -> dict[str, str]:
    """File name -> YAML text, one file per kind, each stamped with the command that regenerates it."""
    grouped: dict[str, list[dict]] = {}
    for doc in plan.documents:
        grouped.setdefault(FILE_NAMES[doc["kind"]], []).append(doc)
    return {name: dump_yaml(docs, plan.header) for name, docs in grouped.items()}


def write_files(out_dir: Path, files: dict[str, str]) -> list[Path]:
    """Each file via a temp file + rename, so an interrupted run never leaves a truncated manifest."""
    return [write_atomic(Path(out_dir) / name, text.encode("utf-8")) for name, text in files.items()]


RUNTIME_KINDS = ("ClusterServingRuntime", "ServingRuntime")


def semantic_findings(docs: Iterable[dict], matrix: Matrix | None = None) -> list[str]:
    """What the CRD schemas cannot say: KServe's naming rules, GPU counts, secrets, probes, known images."""
    docs = list(docs)
    runtimes = {d["metadata"]["name"]: d for d in docs if d.get("kind") in RUNTIME_KINDS}
    # The refs build.py makes, per kind: a group's pods need the group image (OpenSSH), the others the server's.
    servers = {server_image(e) for e in matrix.supported()} if matrix is not None else None
    groups = {server_image(e, None, "group") for e in matrix.supported()} if matrix is not None else None
    findings = _priority_findings(runtimes.values())
    for doc in docs:
        kind, spec = doc.get("kind"), doc.get("spec") or {}
        problems = list(_literal_secrets(doc))
        if kind in RUNTIME_KINDS:
            problems += _runtime_findings(spec)
            containers = spec.get("containers") or []
        elif kind == "InferenceService":
            model = spec.get("predictor", {}).get("model", {})
            problems += _isvc_findings(model, runtimes)
            containers = [model]
        elif kind == "Job":
            containers = spec.get("template", {}).get("spec", {}).get("containers") or []
        elif kind == "LeaderWorkerSet":
            problems += _group_findings(spec.get("leaderWorkerTemplate") or {}, groups)
            containers = []
        else:
            containers = []
        for container in containers:
            problems += _container_findings(container, servers)
        name = f"{kind}/{doc.get('metadata', {}).get('name')}"
        findings += [f"{name}: {problem}" for problem in problems]
    return findings


def _priority_findings(runtimes: Iterable[dict]) -> list[str]:
    seen: dict[tuple, str] = {}
    findings = []
    for runtime in runtimes:
        for fmt in runtime.get("spec", {}).get("supportedModelFormats") or []:
            if not fmt.get("autoSelect"):
                continue
            key = (fmt.get("name"), fmt.get("version"), fmt.get("priority"))
            name = runtime["metadata"]["name"]
            if key in seen:
                findings.append(
                    f"{name}: format {key[0]} {key[1]} has priority {key[2]} like {seen[key]}; "
                    "KServe then picks a runtime at random"
                )
            seen[key] = name
    return findings


def _runtime_findings(spec: dict) -> list[str]:
    problems = []
    protocols = set(spec.get("protocolVersions") or [])
    if not protocols <= KNOWN_PROTOCOLS:
        problems.append(f"protocolVersions {sorted(protocols - KNOWN_PROTOCOLS)} not in {sorted(KNOWN_PROTOCOLS)}")
    for fmt in spec.get("supportedModelFormats") or []:
        if fmt.get("name") == "triton" and fmt.get("autoSelect"):
            problems.append("auto-selected format 'triton' competes with kserve-tritonserver")
    containers = {c.get("name"): c for c in spec.get("containers") or []}
    if CONTAINER not in containers:
        return problems + [f"no container named {CONTAINER} (KServe requires it), found {sorted(containers)}"]
    main = containers[CONTAINER]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe not in main:
            problems.append(f"{CONTAINER} has no {probe}")
    startup = main.get("startupProbe") or {}
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    if startup and budget < STARTUP_BUDGET_SECONDS:
        problems.append(f"startupProbe allows {budget} s, less than the {STARTUP_BUDGET_SECONDS} s a cold build needs")
    return problems


def _isvc_findings(model: dict, runtimes: dict[str, dict]) -> list[str]:
    if not runtimes:
        return []
    runtime = runtimes.get(model.get("runtime", ""))
    if runtime is None:
        return [f"runtime {model.get('runtime')!r} is not among {sorted(runtimes)}"]
    spec = runtime["spec"]
    problems = []
    formats = {fmt.get("name") for fmt in spec.get("supportedModelFormats") or []}
    if model.get("modelFormat", {}).get("name") not in formats:
        problems.append(f"modelFormat {model.get('modelFormat')} is not supported by {model['runtime']}")
    # Without protocolVersion KServe assumes v1; a runtime that lists no protocols accepts any.
    offered = spec.get("protocolVersions") or []
    if offered and model.get("protocolVersion", "v1") not in offered:
        problems.append(f"protocolVersion {model.get('protocolVersion', 'v1')!r} is not offered by {model['runtime']}")
    return problems


def _group_findings(template: dict, known_images: set[str] | None) -> list[str]:
    """Every rank needs a GPU: the group's pods hold TP x PP GPUs, the same number in each pod; each pod runs the
    group image."""
    problems = []
    if template.get("restartPolicy") != "RecreateGroupOnPodRestart":
        problems.append("restartPolicy must be RecreateGroupOnPodRestart: one lost rank ends the MPI job")
    size = template.get("size", 1)
    for role in ("leaderTemplate", "workerTemplate"):
        for container in (template.get(role) or {}).get("spec", {}).get("containers") or []:
            env = {e.get("name"): e.get("value") for e in container.get("env") or []}
            world = int(env.get("TP_SIZE") or 1) * int(env.get("PP_SIZE") or 1)
            got = int((container.get("resources") or {}).get("limits", {}).get(GPU, 0))
            if got * size != world:
                problems.append(f"{role}: {size} pods x {got} GPUs do not hold TP_SIZE*PP_SIZE = {world} ranks")
            problems += [f"{role}: {p}" for p in _image_findings(container, known_images)]
    return problems


def _container_findings(container: dict, known_images: set[str] | None) -> list[str]:
    problems = []
    env = {e.get("name"): e.get("value") for e in container.get("env") or []}
    grpc_port = int(env.get("GRPC_PORT") or GRPC_PORT)
    for port in container.get("ports") or []:
        name = port.get("name", "")
        if port.get("containerPort") == grpc_port and "grpc" not in name and "h2c" not in name:
            problems.append(f"gRPC port {grpc_port} is named {name!r}; KServe needs 'grpc' or 'h2c' in the name")
    if env.get("TP_SIZE") or env.get("PP_SIZE"):
        gpus = int(env.get("TP_SIZE") or 1) * int(env.get("PP_SIZE") or 1)
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            got = (resources.get(section) or {}).get(GPU)
            if got != str(gpus) and not (section == "requests" and got is None):
                problems.append(f"{section}[{GPU}] is {got!r}, but TP_SIZE*PP_SIZE is {gpus}")
    return problems + _image_findings(container, known_images)


def _image_findings(container: dict, known_images: set[str] | None) -> list[str]:
    image = container.get("image")
    if known_images is not None and image and "@" not in image and not _built_here(image, known_images):
        return [f"image {image!r} is not one build.py makes for a supported tag"]
    return []


def _built_here(image: str, known_images: set[str]) -> bool:
    """One of build.py's refs, possibly behind a registry prefix (a digest-pinned image is the user's own)."""
    return any(image == ref or image.endswith("/" + ref) for ref in known_images)


def _literal_secrets(node: Any, path: str = "") -> Iterable[str]:
    if isinstance(node, dict):
        if _SECRET_NAME.search(str(node.get("name", ""))) and "value" in node and "valueFrom" not in node:
            yield f"{path}: {node['name']} has a literal value; use valueFrom.secretKeyRef"
        for key, value in node.items():
            yield from _literal_secrets(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _literal_secrets(value, f"{path}[{index}]")
    elif isinstance(node, str) and _TOKEN_VALUE.search(node):
        yield f"{path}: looks like a Hugging Face token"
