"""The fields of `build.py kserve`'s options, their defaults and what derives from them, before any check: the record
kserve_checks.py reads. KServeOptions (kserve_options.py) is this record, checked when made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from trtllm_entrypoint.config.variables import VARIABLES


@dataclass(frozen=True)
class KServeFields:
    tag: str
    image: str | None = None  # full image ref; default: the server image build.py makes for the tag
    registry: str | None = None  # prefix for the default image ref
    model_id: str | None = None  # hub id; None -> the model that storage_uri puts at /mnt/models
    model_revision: str | None = None
    storage_uri: str | None = None
    adapters: str | None = None  # pvc://<claim>[/<path>]: LoRA adapters mounted read-only for LORA_DIR (docs/lora.md)
    tp_size: int = cast(int, VARIABLES["TP_SIZE"].default)
    pp_size: int = cast(int, VARIABLES["PP_SIZE"].default)
    namespace: str = "default"
    name: str = "llm"
    cache: str = "emptydir"  # "emptydir" | "pvc"
    pvc_name: str | None = None  # default "<name>-trtllm-cache"
    pvc_size: str = "100Gi"
    pvc_access_mode: str = "ReadWriteOnce"
    namespaced_runtime: bool = False
    warm_job: bool = False
    hf_token_secret: str | None = "hf-token"  # Secret with key "token"; optional, so public models need none
    # Secret with key "key"; optional: without it the restricted Triton APIs stay closed to everyone.
    admin_key_secret: str | None = "triton-admin-key"
    storage_readonly: bool = True  # the entrypoint never writes below /mnt/models
    # Autoscaling on Triton's queue/compute ratio (scaling.py), opt-in: max > min turns it on (it needs KEDA and the
    # Prometheus Operator, docs/kserve.md); min == max renders a fixed replica count.
    min_replicas: int = 1
    max_replicas: int = 1
    scale_target: float = 1.0  # time queued per time computed, averaged over the replicas
    scale_down_window: int = 600  # seconds of lower load before replicas go: a cold start costs minutes
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"  # the Prometheus Operator's Service
    # Multi-node: one model replica spans `nodes` pods of a LeaderWorkerSet, TP x PP / nodes GPUs each.
    nodes: int = 1
    ssh_secret: str | None = None  # default "<name>-mpi-ssh": the MPI launcher's key (docs/kserve.md)
    frontend: str = "triton"  # "openai": Triton's OpenAI frontend on the HTTP port (tags with it, matrix entry)
    # What clusters set on every pod (the service's, the warm Job's, a group's), so pods that must agree do.
    pvc_storage_class: str | None = None  # the cache PVC's storageClassName; None: the cluster's default class
    node_selector: tuple[str, ...] = ()  # "KEY=VALUE"
    tolerations: tuple[str, ...] = ()  # "KEY[=VALUE][:EFFECT]", as `kubectl taint` writes a taint
    affinity: str | None = None  # a core/v1 Affinity as JSON
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None
    priority_class: str | None = None
    env: tuple[str, ...] = ()  # "NAME=VALUE", beside the variables the generator sets
    cpu: str = "4"  # request; tokenization and checkpoint conversion run on the CPU
    memory: str = "32Gi"  # request; converting a checkpoint holds it in host memory
    cpu_limit: str | None = None  # None: no CPU limit (a limit throttles tokenization)
    memory_limit: str | None = None  # None: the memory request

    @property
    def gpus(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def claim(self) -> str:
        return self.pvc_name or f"{self.name}-trtllm-cache"

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.min_replicas

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def ssh_secret_name(self) -> str:
        return self.ssh_secret or f"{self.name}-mpi-ssh"

    @property
    def memory_limit_value(self) -> str:
        return self.memory_limit or self.memory

    @property
    def cache_sharers(self) -> list[str]:
        """The pods that mount the cache PVC at once, besides one serving pod (empty: one pod alone)."""
        sharers = []
        if self.nodes > 1:
            sharers.append(f"the {self.nodes} pods of each group")
        if self.max_replicas > 1:
            sharers.append(f"up to {self.max_replicas} replicas")
        if self.warm_job:
            sharers.append("the warm Job beside the serving pod")
        return sharers
