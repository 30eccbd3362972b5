"""Every environment variable the entrypoint reads, parsed and validated once, before any work starts.

A bad value raises UsageError with one line naming the variable, the value and what is allowed. Values are stripped,
and an empty value counts as unset. Tokens never appear in messages or in `describe()`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import stat
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.config import cpus, credentials, server_args, variables
from trtllm_entrypoint.config.environment import TOKEN, Env, bad
from trtllm_entrypoint.config.gpu import Visibility
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.config.records import (
    AccessSettings,
    CommandLine,
    EngineSpec,
    ModelSettings,
    RuntimeSettings,
    ServerSettings,
)
from trtllm_entrypoint.config.server_args import restriction_flags
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.storage.paths import CacheLayout, under_model_dir

# Closed without a key, these would make the model unusable.
CLIENT_APIS = ("metadata", "inference", "model-config")
# Usable as a Triton model name and as a directory name.
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FALLBACK_CACHE_NAME = "trtllm-cache"
NO_COMMAND_LINE = CommandLine()  # `serve` with no server options


@dataclass(frozen=True, kw_only=True)
class Settings(ModelSettings, EngineSpec, RuntimeSettings, ServerSettings, AccessSettings):
    """Every variable, parsed once: the union of the records above, so each field keeps one flat name; code that
    needs only a part takes that record (`engine_spec` for the engine build and its cache key)."""

    # The fields whose variable was set (the others hold defaults): a prebuilt engine's own limits replace defaults.
    explicit: frozenset[str] = frozenset()
    # Names that look like our variables but are not, each with the one it probably meant (warned at start).
    lookalikes: tuple[str, ...] = ()
    gpu_visibility: Visibility = Visibility()  # NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES as given

    @property
    def cache(self) -> CacheLayout:
        return CacheLayout(self.cache_dir)

    @property
    def engine_spec(self) -> EngineSpec:
        return EngineSpec(**{f.name: getattr(self, f.name) for f in fields(EngineSpec)})

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], facts: ImageFacts, command_line: CommandLine = NO_COMMAND_LINE
    ) -> Settings:
        env = Env(environ)
        values = {
            **_model_values(env, facts),
            **_limit_values(env),
            **_server_values(env, facts, command_line),
            **_admin_values(env, command_line),
            **_instance_values(env, cpus.usable_cpus()),
        }
        values["decoupled"] = _decoupled(env, values["frontend"])
        values["cache_dir"], values["cache_fallback_reason"] = _cache_dir(env)
        values["model_init_async"] = env.text("MODEL_INIT_MODE") == "async"
        # Presence matters (an empty NVIDIA_VISIBLE_DEVICES hides every GPU), so these are read as given.
        values["gpu_visibility"] = Visibility(
            environ.get("NVIDIA_VISIBLE_DEVICES"), environ.get("CUDA_VISIBLE_DEVICES")
        )
        values["lookalikes"] = _lookalikes(environ, env.boolean("STRICT_ENV"))
        settings = cls(**values, explicit=frozenset(name.lower() for name in env.given))
        _check_relations(settings)
        if settings.restricted_apis and not command_line.typed_server:  # main checks typed commands itself
            server_args.check_side_doors(
                settings.triton_args,
                side_door_variables(environ),
                "TRITON_ARGS (or the command line)",
            )
        return settings

    def describe(self) -> dict[str, Any]:
        """Every resolved value, JSON-able, for `check` and the start-up log; the token only as set or not."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("hf_token", "admin_key"):
                value = "***" if value else None
            elif f.name == "hub_endpoint":
                value = credentials.USERINFO.sub("://***@", value)
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, frozenset):
                value = sorted(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Visibility):
                value = {"nvidia": value.nvidia, "cuda": value.cuda}
            out[f.name] = value
        out["world_size"] = self.world_size
        return out


def _lookalikes(environ: Mapping[str, str], strict: bool) -> tuple[str, ...]:
    """'NAME (did you mean KNOWN?)' for each variable that looks like ours but is not; STRICT_ENV refuses them."""
    found = tuple(f"{name} (did you mean {meant}?)" for name, meant in variables.lookalikes(environ))
    if found and strict:
        raise UsageError(
            f"not a variable trtllm-entrypoint reads: {', '.join(found)}",
            "fix the names, or unset STRICT_ENV to start with a warning instead",
        )
    return found


def all_apis_open(environ: Mapping[str, str]) -> bool:
    """RESTRICTED_APIS=none: every API open on purpose (checked as Settings checks it)."""
    return Env(environ).names("RESTRICTED_APIS") == ()


def side_door_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the server reads that can open a route around the API restriction (server_args)."""
    return {name: environ.get(name, "") for name, *_ in server_args.SIDE_DOOR_VARIABLES}


def _check_hub_endpoint(env: Env) -> str:
    """HF_ENDPOINT is the hub client's own; a value it cannot use is named here, before any request (its userinfo
    masked: it may hold a mirror's password). The endpoint the client will use: it, or the hub's own."""
    raw = env.text("HF_ENDPOINT")
    if raw is None:
        return contract.DEFAULT_HUB_ENDPOINT
    allowed = "an http:// or https:// URL with a host (e.g. https://huggingface.co), printable ASCII"
    shown = credentials.USERINFO.sub("://***@", raw)
    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018  (raises on a port that is not a number from 0 to 65535)
    except ValueError:
        raise bad("HF_ENDPOINT", shown, allowed) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not TOKEN.fullmatch(raw):
        raise bad("HF_ENDPOINT", shown, allowed)
    return raw.rstrip("/")


def _model_values(env: Env, facts: ImageFacts) -> dict[str, Any]:
    workflows = facts.workflows
    workflow = env.text("WORKFLOW")
    if workflow is not None and workflow.lower() not in workflows:
        raise bad(
            "WORKFLOW",
            workflow,
            f"one of {', '.join(workflows)} (what TensorRT-LLM {facts.tensorrt_llm} in this image supports)",
        )
    templates_dir = env.path("TEMPLATES_DIR") or facts.templates_dir
    engine_dir = env.path("ENGINE_DIR")
    # A prebuilt engine can only be served by the engine workflow, whatever this image defaults to.
    default_workflow = "engine" if engine_dir is not None and "engine" in workflows else facts.default_workflow
    return {
        "model_id": env.template_safe("MODEL_ID"),
        "model_revision": env.text("MODEL_REVISION"),
        "hf_token": credentials.hf_token(env),
        "hub_endpoint": _check_hub_endpoint(env),
        "engine_dir": engine_dir,
        "templates_dir": templates_dir,
        "repository_dir": env.path("REPOSITORY_DIR"),
        "lora_dir": env.path("LORA_DIR"),
        "lora_max_rank": env.integer("LORA_MAX_RANK"),
        "workflow": workflow.lower() if workflow else default_workflow,
        "tp_size": env.integer("TP_SIZE"),
        "pp_size": env.integer("PP_SIZE"),
        "dtype": env.choice("DTYPE"),
        "quantization": env.choice("QUANTIZATION"),
    }


def _limit_values(env: Env) -> dict[str, Any]:
    return {
        "max_batch_size": env.integer("MAX_BATCH_SIZE"),
        "max_input_len": env.integer("MAX_INPUT_LEN"),
        "max_seq_len": env.integer("MAX_SEQ_LEN"),
        "max_num_tokens": env.integer("MAX_NUM_TOKENS"),
        "max_beam_width": env.integer("MAX_BEAM_WIDTH"),
        "kv_cache_free_gpu_mem_fraction": env.fraction("KV_CACHE_FREE_GPU_MEM_FRACTION"),
        "enable_kv_cache_reuse": env.boolean("ENABLE_KV_CACHE_REUSE"),
        "decoupled": env.boolean("DECOUPLED"),
        "enable_bls": env.boolean("ENABLE_BLS"),
        "exit_timeout_secs": env.integer("EXIT_TIMEOUT_SECS"),
        "lock_timeout_secs": env.integer("LOCK_TIMEOUT_SECS"),
    }


def _instance_values(env: Env, usable_cpus: int) -> dict[str, Any]:
    """Python model instances and the OpenAI front's processes; the defaults follow the CPUs the container may use
    (see cpus.py)."""
    default = cpus.default_instances(usable_cpus)
    return {
        "preprocessing_instances": env.integer("PREPROCESSING_INSTANCES", default),
        "postprocessing_instances": env.integer("POSTPROCESSING_INSTANCES", default),
        "openai_workers": env.integer("OPENAI_WORKERS", cpus.default_front_workers(usable_cpus)),
        "openai_max_generations": env.integer("OPENAI_MAX_GENERATIONS"),
    }


def _decoupled(env: Env, frontend: str) -> bool:
    """The OpenAI front streams every answer (whole ones are the stream, gathered), so its model is decoupled."""
    if frontend != "openai":
        return env.boolean("DECOUPLED")
    if env.text("DECOUPLED") is not None and not env.boolean("DECOUPLED"):
        raise UsageError(
            "DECOUPLED=false cannot serve FRONTEND=openai: the OpenAI front streams from a decoupled model",
            "leave DECOUPLED unset with FRONTEND=openai (it is then true), or set FRONTEND=triton",
        )
    return True


def _server_values(env: Env, facts: ImageFacts, command_line: CommandLine) -> dict[str, Any]:
    frontend = "triton" if command_line.typed_server else env.choice("FRONTEND")
    name = env.text("SERVED_MODEL_NAME")
    # The OpenAI front serves under a model's id too (`org/name`); Triton's entry model keeps its own name then.
    if name is not None and not (SERVED_NAME.fullmatch(name) or (frontend == "openai" and contract.is_hub_id(name))):
        also = f", or with FRONTEND=openai {contract.HUB_ID_RULE}" if frontend == "openai" else ""
        raise bad(
            "SERVED_MODEL_NAME",
            name,
            f"up to 128 letters, digits, '.', '_' or '-', starting with a letter or digit{also}",
        )
    raw_args = env.text("TRITON_ARGS") or ""
    try:
        triton_args = tuple(shlex.split(raw_args))
    except ValueError as exc:
        raise bad("TRITON_ARGS", raw_args, f"arguments in shell quoting ({exc})") from None
    server_args.check_extra_arguments(triton_args)
    if not command_line.typed_server:
        server_args.check_extra_arguments(command_line.server_args, source="the command line")
    ports = {
        name: command_line.ports.get(name) or env.integer(name.upper())
        for name in ("http_port", "grpc_port", "metrics_port", "openai_port")
    }
    return {
        **ports,
        "frontend": frontend,
        "served_model_name": name,
        "tool_call_parser": env.choice("TOOL_CALL_PARSER"),
        "log_format": env.choice("LOG_FORMAT"),
        "log_level": env.choice("LOG_LEVEL"),
        "progress_secs": env.integer("PROGRESS_INTERVAL_SECS"),
        "triton_args": triton_args + command_line.server_args,
    }


def _admin_values(env: Env, command_line: CommandLine) -> dict[str, Any]:
    apis = env.names("RESTRICTED_APIS")
    if command_line.typed_server and restriction_flags(command_line.server_args):
        apis = ()  # the typed command restricts APIs itself: ours would clash
    key = credentials.given_secret(env, *credentials.SECRETS[1])
    variable = "TRITON_ADMIN_KEY_FILE" if env.text("TRITON_ADMIN_KEY_FILE") else "TRITON_ADMIN_KEY"
    closed = [api for api in apis if api in CLIENT_APIS]
    if closed and key is None:
        raise UsageError(
            f"RESTRICTED_APIS closes {', '.join(closed)} but no TRITON_ADMIN_KEY or "
            "TRITON_ADMIN_KEY_FILE is set: no client could use the model",
            "set TRITON_ADMIN_KEY_FILE to a mounted secret, or leave those APIs out",
        )
    return {
        "restricted_apis": apis,
        "admin_key": credentials.checked_key(key, variable) if key else credentials.generated_key(),
        "admin_key_generated": key is None,
    }


def _writable(path: Path) -> bool:
    """Whether `path` can be written, or created below its nearest existing parent (EROFS counts as not)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.access(probe, os.W_OK)


def _cache_dir(env: Env) -> tuple[Path, str | None]:
    explicit = env.path("CACHE_DIR")
    if explicit is not None:
        return explicit, None
    default = Path(contract.DEFAULT_CACHE_DIR)
    if _writable(default):
        return default, None
    # Per UID, and used only while it is this UID's own directory: TMPDIR may be shared, and another UID could
    # create the name first (a link, or a directory it can change).
    fallback = Path(tempfile.gettempdir()) / f"{FALLBACK_CACHE_NAME}-{os.geteuid()}"
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(fallback)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise UsageError(
                f"the default CACHE_DIR {default} is not writable, and the fallback {fallback} was not created by "
                "this UID (another user may have put it there)",
                f"set CACHE_DIR to a directory of your own, or mount a volume at {default}",
            )
    reason = (
        f"the default CACHE_DIR {default} is not writable (read-only root file system?); using {fallback}, "
        f"which is lost with the container: mount a volume at {default} or set CACHE_DIR to keep engines"
    )
    return fallback, reason


def _check_relations(s: Settings) -> None:
    """Rules that involve more than one variable."""
    if s.max_seq_len <= s.max_input_len:
        raise bad("MAX_SEQ_LEN", s.max_seq_len, f"a number greater than MAX_INPUT_LEN={s.max_input_len}")
    # Without chunked context a whole prompt is scheduled in one step, so the step budget must hold it.
    if s.max_num_tokens < s.max_input_len:
        raise bad("MAX_NUM_TOKENS", s.max_num_tokens, f"a number at least MAX_INPUT_LEN={s.max_input_len}")
    ports = {"HTTP_PORT": s.http_port, "GRPC_PORT": s.grpc_port, "METRICS_PORT": s.metrics_port}
    if s.frontend == "openai":  # otherwise nothing listens there
        ports["OPENAI_PORT"] = s.openai_port
    seen: dict[int, str] = {}
    for name, port in ports.items():
        if port in seen:
            raise bad(name, port, f"a port different from {seen[port]}={port} (the ports in use must be distinct)")
        seen[port] = name
    inner = contract.INNER_MODELS[s.workflow]
    if s.served_model_name in inner:
        raise bad(
            "SERVED_MODEL_NAME",
            s.served_model_name,
            f"a name other than {', '.join(inner)} (the repository's own models have them)",
        )
    if s.workflow == "llmapi" and s.quantization != "none":
        raise bad(
            "QUANTIZATION",
            s.quantization,
            "none with WORKFLOW=llmapi (it serves the checkpoint as is: use a pre-quantized checkpoint)",
        )
    if s.workflow == "llmapi" and s.engine_dir is not None:
        raise bad("ENGINE_DIR", s.engine_dir, "unset with WORKFLOW=llmapi (prebuilt engines need WORKFLOW=engine)")
    for name, path in (("CACHE_DIR", s.cache_dir), ("REPOSITORY_DIR", s.repository_dir)):
        if path is not None and under_model_dir(path):
            raise bad(
                name, path, f"a writable directory outside {contract.KSERVE_MODEL_DIR} (KServe mounts it read-only)"
            )
