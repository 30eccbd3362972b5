"""The typed records the settings are made of, each a part that code needing only it takes: the model and its files,
the engine's spec (parallelism and limits: all an engine build and its cache key read), the runtime, the server's
endpoints, the access rules, and what the command line adds. settings.py parses the environment into their union.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trtllm_entrypoint.config.variables import Dtype, Frontend, LogFormat, LogLevel, Quantization, Workflow

# A field of EngineSpec that no variable sets: the variable it is derived from (docs/cache.md names that one).
DERIVED_FROM = "derived_from"


@dataclass(frozen=True)
class CommandLine:
    """What the container's command line adds to the environment."""

    server_args: tuple[str, ...] = ()  # after TRITON_ARGS on the server's command line
    ports: Mapping[str, int] = field(default_factory=dict)  # by field name; they win over the variables
    # A `tritonserver …` command typed by the user: its arguments are its own (not checked, its own API restriction
    # flags win over RESTRICTED_APIS) and there is no OpenAI front.
    typed_server: bool = False


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """What is served and where its files live."""

    model_id: str | None
    model_revision: str | None
    hf_token: str | None = field(repr=False)
    hub_endpoint: str = field(repr=False)  # HF_ENDPOINT or the hub's own; may hold a mirror's password
    engine_dir: Path | None
    templates_dir: Path
    repository_dir: Path | None
    cache_dir: Path
    # Set when CACHE_DIR was not given and the default was not writable; the orchestrator logs it as a warning.
    cache_fallback_reason: str | None = None
    model_init_async: bool = False  # MODEL_INIT_MODE=async: a modelcar may put the model in place after we start
    workflow: Workflow
    lora_dir: Path | None = None  # LORA_DIR: PEFT adapters, one per subdirectory (model/adapters.py)
    lora_max_rank: int = 64  # LORA_MAX_RANK


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """How the model is split over GPUs; fixed when an engine is built (its config.json's mapping)."""

    tp_size: int
    pp_size: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What a request and a batch may hold; an engine bakes them in (its config.json's build_config)."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int


@dataclass(frozen=True, kw_only=True)
class EngineSpec(Parallelism, Limits):
    """Everything that shapes a built engine. The build commands read nothing else and its fields are the engine
    cache key, so a setting that changes the engine but is not here cannot reach the build."""

    dtype: Dtype
    quantization: Quantization
    enable_kv_cache_reuse: bool  # also turns on paged context FMHA at build time
    # trtllm-build's LoRA flags, derived from LORA_DIR's adapters once they are read (launch/lora.py); empty without.
    lora_flags: tuple[str, ...] = field(default=(), metadata={DERIVED_FROM: "LORA_DIR"})


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings:
    """How the served model behaves; changing these reuses a cached engine."""

    kv_cache_free_gpu_mem_fraction: float
    decoupled: bool
    enable_bls: bool = False
    preprocessing_instances: int
    postprocessing_instances: int
    exit_timeout_secs: int
    lock_timeout_secs: int


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """The server's endpoints and extra arguments."""

    http_port: int
    grpc_port: int
    metrics_port: int
    openai_port: int
    frontend: Frontend
    openai_workers: int  # processes of the OpenAI front (FRONTEND=openai), sharing OPENAI_PORT
    openai_max_generations: int  # OPENAI_MAX_GENERATIONS: prompts x n of one OpenAI request, at most
    tool_call_parser: str = "auto"  # TOOL_CALL_PARSER: how the front reads tool calls (contract.TOOL_CALL_PARSERS)
    served_model_name: str | None
    log_format: LogFormat
    log_level: LogLevel = "info"  # LOG_LEVEL: debug adds the full tables and command lines
    progress_secs: int = 10  # PROGRESS_INTERVAL_SECS: download progress and the heartbeat of long steps
    triton_args: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class AccessSettings:
    """Which Triton APIs need the admin key (see security.py)."""

    restricted_apis: tuple[str, ...]  # closed to clients without the admin key (RESTRICTED_APIS)
    admin_key: str = field(repr=False, compare=False)  # TRITON_ADMIN_KEY(_FILE), or random per start
    admin_key_generated: bool  # no key given: nobody can call the restricted APIs
