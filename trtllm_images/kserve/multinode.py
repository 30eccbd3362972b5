"""A model larger than one node: a LeaderWorkerSet group per model replica, its leader Service, a NetworkPolicy, the
PodMonitor and the KEDA ScaledObject that scales the groups. Pure, like kserve.py, and built from the same pod
pieces (pod.py).

Every pod of a group runs the same image with the LWS variables; the entrypoint makes index 0 the leader (it waits for
its workers, then runs mpirun across them over ssh) and the others workers (they prepare the same engine and
repository from the cache, then run sshd). docs/kserve.md says why ssh and not `kubectl exec`.
"""

from __future__ import annotations

from typing import Any

from trtllm_entrypoint.contract import (
    DEFAULT_CACHE_DIR as CACHE_DIR,
)
from trtllm_entrypoint.contract import (
    DEFAULT_GRPC_PORT as GRPC_PORT,
)
from trtllm_entrypoint.contract import (
    DEFAULT_HTTP_PORT as HTTP_PORT,
)
from trtllm_entrypoint.contract import (
    DEFAULT_METRICS_PORT as METRICS_PORT,
)
from trtllm_entrypoint.contract import MPI_SSH_DIR, MPI_SSH_PORT, STOP_GRACE_SECS, UID
from trtllm_images.kserve import pod, scaling
from trtllm_images.kserve.options import KServeOptions

LWS_API = "leaderworkerset.x-k8s.io/v1"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # LWS labels every pod of the set with it
ROLE_LABEL = "role"  # ours, on the leader template: the Service and the PodMonitor pick leaders by it
SSH_VOLUME = "mpi-ssh"
CONTAINER = "server"


def group_documents(o: KServeOptions, image: str, workflow: str) -> list[dict]:
    docs = [_leader_worker_set(o, image), _leader_service(o), _network_policy(o)]
    if o.autoscaled:  # the PodMonitor feeds the autoscaler: both need the Prometheus Operator and KEDA
        docs.append(pod.pod_monitor(o, f"{o.name}-triton", {NAME_LABEL: o.name, ROLE_LABEL: "leader"}))
        docs.append(_scaled_object(o, workflow))
    return docs


def _ports(leader: bool) -> list[dict]:
    if not leader:
        return [{"name": "ssh", "containerPort": MPI_SSH_PORT, "protocol": "TCP"}]
    return [
        {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
        {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        {"name": pod.METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},
    ]


def _probes(leader: bool) -> dict:
    if not leader:  # sshd listens only once the worker's engine and repository are ready
        return {"readinessProbe": {"tcpSocket": {"port": MPI_SSH_PORT}, "periodSeconds": 10}}
    return pod.serving_probes("triton", port=HTTP_PORT)


def _pod(o: KServeOptions, image: str, leader: bool) -> dict:
    env = pod.model_env(o) + (pod.admin_key_env(o) if leader else [])
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "env": env,
        "ports": _ports(leader),
        "resources": pod.gpu_resources(o, o.gpus_per_node),
        **_probes(leader),
        "securityContext": pod.security_context(),
        "volumeMounts": [
            {"name": pod.CACHE_VOLUME, "mountPath": CACHE_DIR},
            {"name": pod.SHM_VOLUME, "mountPath": "/dev/shm"},
            {"name": SSH_VOLUME, "mountPath": MPI_SSH_DIR, "readOnly": True},
        ],
    }
    ssh = {"secret": {"secretName": o.ssh_secret_name, "defaultMode": 0o400}}
    return {
        "terminationGracePeriodSeconds": STOP_GRACE_SECS,
        "securityContext": {"fsGroup": UID},
        **pod.pod_settings(o),
        "containers": [container],
        "volumes": [pod.cache_volume(o), pod.shm_volume(), {"name": SSH_VOLUME, **ssh}],
    }


def _leader_worker_set(o: KServeOptions, image: str) -> dict:
    template = {
        "size": o.nodes,
        # A rank that dies takes the whole MPI job with it: the group restarts together.
        "restartPolicy": "RecreateGroupOnPodRestart",
        "leaderTemplate": {
            "metadata": {"labels": {**pod.PART_OF, ROLE_LABEL: "leader"}},
            "spec": _pod(o, image, leader=True),
        },
        "workerTemplate": {
            "metadata": {"labels": {**pod.PART_OF, ROLE_LABEL: "worker"}},
            "spec": _pod(o, image, leader=False),
        },
    }
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": pod.meta(o.name, o.namespace),
        "spec": {
            "replicas": o.min_replicas,
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": "Shared"},  # the headless Service is named after the set
            "leaderWorkerTemplate": template,
        },
    }


def _leader_service(o: KServeOptions) -> dict:
    ports = [{**p, "port": p["containerPort"], "targetPort": p["name"]} for p in _ports(leader=True)]
    for port in ports:
        del port["containerPort"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pod.meta(f"{o.name}-leader", o.namespace),
        "spec": {"type": "ClusterIP", "selector": {NAME_LABEL: o.name, ROLE_LABEL: "leader"}, "ports": ports},
    }


def _network_policy(o: KServeOptions) -> dict:
    """sshd runs in every worker: only pods of the same set may reach it (or anything else but the serving ports)."""
    group = {"podSelector": {"matchLabels": {NAME_LABEL: o.name}}}
    serving = [{"port": p["containerPort"], "protocol": "TCP"} for p in _ports(leader=True)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": pod.meta(f"{o.name}-group", o.namespace),
        "spec": {
            "podSelector": {"matchLabels": {NAME_LABEL: o.name}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [group]}, {"ports": serving}],
        },
    }


def leader_pods(o: KServeOptions) -> dict[str, str]:
    """The leader pods (named <set>-<group>; workers add -<index>), where rank 0 serves and exports metrics."""
    return {"namespace": o.namespace, "pod": f"{o.name}-[0-9]+"}


def _scaled_object(o: KServeOptions, workflow: str) -> dict:
    """KEDA scales the LeaderWorkerSet (it has a scale subresource) by groups, on the same signal as a service."""
    trigger = {
        "type": "prometheus",
        "metricType": "Value",
        "metadata": {
            "serverAddress": o.prometheus_url,
            "query": scaling.query(scaling.stage_models(workflow, o.name), leader_pods(o)),
            "threshold": str(o.scale_target),
        },
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": pod.meta(o.name, o.namespace),
        "spec": {
            "scaleTargetRef": {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": o.name},
            "minReplicaCount": o.min_replicas,
            "maxReplicaCount": o.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": o.scale_down_window}}
                }
            },
            "triggers": [trigger],
        },
    }
