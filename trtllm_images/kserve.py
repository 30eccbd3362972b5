"""KServe manifests for a server image: a (Cluster)ServingRuntime, an example InferenceService, an optional cache PVC
and a Job that warms it. Pure: options in, dicts/text out (`write_files` is the only I/O); docs/kserve.md says why.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import yaml

from trtllm_images.errors import UsageError
from trtllm_images.files import write_atomic
from trtllm_images.kserve_options import KServeOptions
from trtllm_images.plan import make_plan

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix, MatrixEntry

# Must agree with entrypoints/trtllm_entrypoint/contract.py (the packages never import each other; a test compares).
MODEL_DIR = "/mnt/models"
CACHE_DIR = "/var/cache/trtllm"

CONTAINER = "kserve-container"            # KServe refuses a runtime without a container of this name
MODEL_FORMAT = "tensorrt-llm"             # our own format, so auto-selection never competes with kserve-tritonserver
PROTOCOLS = ("v2", "grpc-v2")
KNOWN_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8080, 9000, 8002  # KServe's HTTP default; gRPC/metrics as its stock Triton runtime
GPU = "nvidia.com/gpu"
UID = 1000                                # the NGC images' triton-server user
STARTUP_BUDGET_SECONDS = 2 * 3600         # a cold engine build of a large model
STARTUP_PERIOD_SECONDS = 30
CACHE_VOLUME, SHM_VOLUME, MODELS_VOLUME = "trtllm-cache", "devshm", "models"
TOKEN_KEY = "token"
PART_OF = {"app.kubernetes.io/part-of": "trtllm-images"}

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|KEY)", re.IGNORECASE)
_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}")


def server_image(entry: MatrixEntry, registry: str | None = None) -> str:
    # The plan is the one place that names images; out_dir is irrelevant to the ref.
    return make_plan(entry, registry=registry, out_dir=Path(".")).image("server").ref


def runtime_name(tag: str) -> str:
    return "trtllm-" + tag.replace(".", "-")


def manifests(entry: MatrixEntry, options: KServeOptions) -> list[dict]:
    """Runtime, [PVC], InferenceService, [warm Job], in the order `kubectl apply` needs them."""
    if entry.tag != options.tag:
        raise UsageError(f"matrix entry {entry.tag} does not match --tag {options.tag}", "pass the entry of that tag")
    default_image = server_image(entry, options.registry)  # also refuses unsupported tags, even with --image
    image = options.image or default_image
    docs = [_runtime(entry, options, image)]
    if options.cache == "pvc":
        docs.append(_pvc(options))
    docs.append(_inference_service(options))
    if options.warm_job:
        docs.append(_warm_job(options, image))
    return docs


def _meta(name: str, namespace: str | None, annotations: dict | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": dict(PART_OF), "annotations": annotations}
    return {key: value for key, value in meta.items() if value}


def _env(pairs: dict[str, Any]) -> list[dict]:
    return [{"name": key, "value": str(value)} for key, value in pairs.items() if value is not None]


def _gpu_resources(gpus: int, **more: str) -> dict:
    return {"requests": {**more, GPU: str(gpus)}, "limits": {GPU: str(gpus)}}


def _security_context() -> dict:
    return {"runAsNonRoot": True, "runAsUser": UID, "allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _probe(path: str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": HTTP_PORT}, "periodSeconds": period, "timeoutSeconds": 5,
            "failureThreshold": failures}


def _runtime(entry: MatrixEntry, o: KServeOptions, image: str) -> dict:
    container = {
        "name": CONTAINER,
        "image": image,
        # No args: the image's ENTRYPOINT + CMD ["serve"] start Triton; ports and names come from the environment.
        "env": _env({"HTTP_PORT": HTTP_PORT, "GRPC_PORT": GRPC_PORT, "METRICS_PORT": METRICS_PORT,
                     "CACHE_DIR": CACHE_DIR, "SERVED_MODEL_NAME": "{{.Name}}",
                     "TP_SIZE": o.tp_size, "PP_SIZE": o.pp_size}),
        # One port only: Knative rejects more, and KServe's Service sends port 80 to the first one.
        "ports": [{"name": "http1", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": _gpu_resources(o.gpus, cpu="4", memory="32Gi"),
        "startupProbe": _probe("/v2/health/ready", STARTUP_PERIOD_SECONDS,
                               STARTUP_BUDGET_SECONDS // STARTUP_PERIOD_SECONDS),
        "readinessProbe": _probe("/v2/health/ready", 10, 3),
        "livenessProbe": _probe("/v2/health/live", 30, 4),
        "securityContext": _security_context(),
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
    }
    spec = {
        "annotations": {"prometheus.kserve.io/port": str(METRICS_PORT), "prometheus.kserve.io/path": "/metrics"},
        "supportedModelFormats": [{"name": MODEL_FORMAT, "version": entry.tensorrt_llm, "autoSelect": True,
                                   "priority": 1}],
        "protocolVersions": list(PROTOCOLS),
        "containers": [container],
        "volumes": [_shm_volume()],
    }
    kind = "ServingRuntime" if o.namespaced_runtime else "ClusterServingRuntime"
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": kind,
            "metadata": _meta(runtime_name(o.tag), o.namespace if o.namespaced_runtime else None),
            "spec": spec}


def _model_env(o: KServeOptions) -> list[dict]:
    """What decides the engine: shared by the service and the warm Job, so both compute the same cache key."""
    env = _env({"MODEL_ID": o.model_id, "MODEL_REVISION": o.model_revision, "CACHE_DIR": CACHE_DIR,
                "TP_SIZE": o.tp_size, "PP_SIZE": o.pp_size})
    if o.model_id and o.hf_token_secret:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": o.hf_token_secret, "key": TOKEN_KEY, "optional": True}}})
    return env


def _shm_volume() -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}  # NCCL outgrows 64 MB


def _cache_volume(o: KServeOptions) -> dict:
    if o.cache == "pvc":
        return {"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": o.claim}}
    return {"name": CACHE_VOLUME, "emptyDir": {}}


def _inference_service(o: KServeOptions) -> dict:
    annotations = {"serving.kserve.io/deploymentMode": "RawDeployment"}  # Standard from 0.16; this spelling: all
    model: dict[str, Any] = {"modelFormat": {"name": MODEL_FORMAT}, "protocolVersion": "v2",
                             "runtime": runtime_name(o.tag)}
    if o.storage_uri:
        model["storageUri"] = o.storage_uri
        annotations["storage.kserve.io/readonly"] = "true" if o.storage_readonly else "false"
    model.update({
        "env": _model_env(o),
        # Both ports, HTTP first: raw deployments expose every declared port, the first one as the Service's port 80.
        "ports": [{"name": "http1", "containerPort": HTTP_PORT, "protocol": "TCP"},
                  {"name": "grpc-v2", "containerPort": GRPC_PORT, "protocol": "TCP"}],
        "resources": _gpu_resources(o.gpus),
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_DIR}],
    })
    predictor = {"minReplicas": 1, "terminationGracePeriodSeconds": 60,  # Triton drains for 30 s on SIGTERM
                 "securityContext": {"fsGroup": UID}, "model": model, "volumes": [_cache_volume(o)]}
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": _meta(o.name, o.namespace, annotations), "spec": {"predictor": predictor}}


def _pvc(o: KServeOptions) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(o.claim, o.namespace),
            "spec": {"accessModes": [o.pvc_access_mode], "resources": {"requests": {"storage": o.pvc_size}}}}


def _warm_job(o: KServeOptions, image: str) -> dict:
    mounts = [{"name": CACHE_VOLUME, "mountPath": CACHE_DIR}, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    volumes = [_cache_volume(o), _shm_volume()]
    if o.storage_uri:  # validated: pvc://<claim>[/<path>]
        claim, _, sub_path = o.storage_uri[len("pvc://"):].partition("/")
        mount = {"name": MODELS_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
        if sub_path:
            mount["subPath"] = sub_path
        mounts.append(mount)
        volumes.append({"name": MODELS_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    container = {"name": "prepare", "image": image, "args": ["prepare"], "env": _model_env(o),
                 # Building an engine needs the same GPUs (and GPU model) as serving it.
                 "resources": _gpu_resources(o.gpus, cpu="4", memory="32Gi"),
                 "securityContext": _security_context(), "volumeMounts": mounts}
    pod = {"restartPolicy": "Never", "securityContext": {"fsGroup": UID}, "containers": [container],
           "volumes": volumes}
    spec = {"backoffLimit": 1, "activeDeadlineSeconds": STARTUP_BUDGET_SECONDS, "ttlSecondsAfterFinished": 86400,
            "template": {"metadata": {"labels": dict(PART_OF)}, "spec": pod}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(f"{o.name}-warm-cache", o.namespace),
            "spec": spec}


def command_line(options: KServeOptions) -> str:
    """The `build.py kserve` invocation that produces these options (stamped into generated files)."""
    argv = ["python", "build.py", "kserve"]
    for field in fields(KServeOptions):
        value = getattr(options, field.name)
        if value == field.default:
            continue
        if field.name == "storage_readonly":
            argv.append("--storage-writable")
        elif field.name == "hf_token_secret" and value is None:
            argv.append("--no-hf-token")
        elif isinstance(value, bool):
            argv.append("--" + field.name.replace("_", "-"))
        else:
            argv += ["--" + field.name.replace("_", "-"), str(value)]
    return shlex.join(argv)


def dump_yaml(docs: Iterable[dict], header: str = "") -> str:
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.safe_dump_all(list(docs), sort_keys=False, default_flow_style=False, width=120,
                                        explicit_start=True)


FILE_NAMES = {"ClusterServingRuntime": "runtime.yaml", "ServingRuntime": "runtime.yaml",
              "PersistentVolumeClaim": "cache-pvc.yaml", "InferenceService": "inferenceservice.yaml",
              "Job": "warm-cache-job.yaml"}


def render_files(entry: MatrixEntry, options: KServeOptions) -> dict[str, str]:
    """File name -> YAML text, each stamped with the command that regenerates it."""
    header = f"Generated by: {command_line(options)}\nDo not edit; change the options and regenerate."
    grouped: dict[str, list[dict]] = {}
    for doc in manifests(entry, options):
        grouped.setdefault(FILE_NAMES[doc["kind"]], []).append(doc)
    return {name: dump_yaml(docs, header) for name, docs in grouped.items()}


def write_files(out_dir: Path, files: dict[str, str]) -> list[Path]:
    """Each file via a temp file + rename, so an interrupted run never leaves a truncated manifest."""
    return [write_atomic(Path(out_dir) / name, text.encode("utf-8")) for name, text in files.items()]


RUNTIME_KINDS = ("ClusterServingRuntime", "ServingRuntime")


def semantic_findings(docs: Iterable[dict], matrix: Matrix | None = None) -> list[str]:
    """What the CRD schemas cannot say: KServe's naming rules, GPU counts, secrets, probes, known images."""
    docs = list(docs)
    runtimes = {d["metadata"]["name"]: d for d in docs if d.get("kind") in RUNTIME_KINDS}
    known = {server_image(e) for e in matrix.supported()} if matrix is not None else None
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
        else:
            containers = []
        for container in containers:
            problems += _container_findings(container, known)
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
                findings.append(f"{name}: format {key[0]} {key[1]} has priority {key[2]} like {seen[key]}; "
                                "KServe then picks a runtime at random")
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
    # Without protocolVersion KServe assumes v1, which our runtime does not list.
    if model.get("protocolVersion") not in (spec.get("protocolVersions") or []):
        problems.append(f"protocolVersion {model.get('protocolVersion')!r} is not offered by {model['runtime']}")
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
    image = container.get("image")
    if known_images is not None and image and "@" not in image:
        if not any(image == ref or image.endswith("/" + ref) for ref in known_images):
            problems.append(f"image {image!r} is not one build.py makes for a supported tag")
    return problems


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
