"""`--nodes` above 1: a LeaderWorkerSet group per model replica (kserve/multinode.py), and what it refuses."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from tests.unit.kserve.kserve_documents import HUB_MODEL, MULTINODE_OPTIONS, by_kind, documents
from trtllm_entrypoint.errors import UsageError
from trtllm_images.kserve import findings as kserve_findings
from trtllm_images.kserve import plan as kserve
from trtllm_images.kserve import scaling


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


def test_a_group_reads_its_model_by_id_and_has_no_warm_job():
    with pytest.raises(UsageError, match="reads its model by --model-id"):
        kserve.KServeOptions(tag="25.01", storage_uri="s3://b/m", nodes=2, tp_size=8)
    with pytest.raises(UsageError, match="--warm-job is for single-node"):
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, nodes=2, tp_size=8, cache="pvc", warm_job=True)
