"""KServe manifests against KServe's own CRD schemas (and the LeaderWorkerSet, PodMonitor and ScaledObject ones),
plus the rules the schemas cannot say (kserve/findings.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex

import pytest
import yaml

from harness.upstream_files import upstream_path
from tests.unit.kserve.kserve_documents import (
    AFFINITY,
    AUTOSCALED_OPTIONS,
    HUB_MODEL,
    REPO,
    SCALE_OUT_CRDS,
    by_kind,
    documents,
    grid,
    isvc_model,
    load_matrix,
    runtime_container,
    schema_errors,
    validation_errors,
)
from trtllm_entrypoint.errors import Error
from trtllm_images.kserve import findings as kserve_findings
from trtllm_images.kserve import plan as kserve


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


def _default_docs(entry):
    options = dataclasses.replace(AUTOSCALED_OPTIONS, registry=None)
    return documents(options)


BREAKAGES = {
    "container renamed": (lambda d: runtime_container(d).update(name="main"), "no container named kserve-container"),
    "unknown protocol": (lambda d: d[0]["spec"].update(protocolVersions=["v2", "v3"]), "protocolVersions ['v3']"),
    "grpc port misnamed": (lambda d: isvc_model(d)["ports"][1].update(name="rpc"), "gRPC port 8001 is named 'rpc'"),
    "gpu count": (lambda d: isvc_model(d)["resources"]["limits"].update({"nvidia.com/gpu": "2"}), "TP_SIZE*PP_SIZE"),
    "literal token": (lambda d: isvc_model(d)["env"].append({"name": "HF_TOKEN", "value": "x"}), "literal value"),
    "token in args": (lambda d: runtime_container(d).update(args=["--token=hf_" + "a" * 30]), "Hugging Face token"),
    "no liveness": (lambda d: runtime_container(d).pop("livenessProbe"), "no livenessProbe"),
    "short startup": (
        lambda d: runtime_container(d)["startupProbe"].update(failureThreshold=10),
        "startupProbe allows",
    ),
    "unknown image": (lambda d: runtime_container(d).update(image="trtllm-serve:99.01-trtllm-9"), "not one build.py"),
    "v1 protocol": (lambda d: isvc_model(d).pop("protocolVersion"), "protocolVersion 'v1' is not offered"),
    "wrong runtime": (lambda d: isvc_model(d).update(runtime="kserve-tritonserver"), "runtime 'kserve-tritonserver'"),
    "wrong format": (lambda d: isvc_model(d).update(modelFormat={"name": "onnx"}), "modelFormat"),
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
        "trtllm_images.kserve.pod.shm_volume",
        lambda: {"name": "devshm", "emptyDir": {}, "env": [{"name": "API_KEY", "value": "literal"}]},
    )
    with pytest.raises(Error, match="break KServe's rules: .*API_KEY has a literal value"):
        kserve.make_kserve_plan(load_matrix(), kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL))


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
