"""What KServe's webhooks would reject later and the CRD schemas cannot say, checked on the generated manifests before
anything is written: naming rules, protocols, probes, GPU counts against TP x PP, literal secrets, and images build.py
does not make. Pure: documents in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trtllm_images.kserve import pod
from trtllm_images.kserve.pod import GPU, GRPC_PORT, STARTUP_BUDGET_SECONDS

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix

CONTAINER = "kserve-container"  # KServe refuses a runtime without a container of this name
KNOWN_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
RUNTIME_KINDS = ("ClusterServingRuntime", "ServingRuntime")

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|KEY)", re.IGNORECASE)
_TOKEN_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{20,}")


def semantic_findings(docs: Iterable[dict], matrix: Matrix | None = None) -> list[str]:
    """What the CRD schemas cannot say: KServe's naming rules, GPU counts, secrets, probes, known images."""
    docs = list(docs)
    runtimes = {d["metadata"]["name"]: d for d in docs if d.get("kind") in RUNTIME_KINDS}
    # The refs build.py makes, per kind: a group's pods need the group image (OpenSSH), the others the server's.
    servers = {pod.server_image(e) for e in matrix.supported()} if matrix is not None else None
    groups = {pod.server_image(e, None, "group") for e in matrix.supported()} if matrix is not None else None
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
