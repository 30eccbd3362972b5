"""LORA_DIR in a start: before anything is downloaded or built, every adapter read, checked against the base and
numbered, and the engine's LoRA flags put into the settings (so into the engine cache key); once the engine exists,
the adapters converted into the cache's prefetch layout and the tensorrt_llm model's LoRA parameters for the fill.
The rules themselves live in model/adapters.py and model/adapter_set.py; the conversion in engine/adapter_cache.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.engine import adapter_cache
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model import adapter_set, adapters
from trtllm_entrypoint.model import name as model_name
from trtllm_entrypoint.model.adapters import Adapter
from trtllm_entrypoint.model.digest import content_digest
from trtllm_entrypoint.repository import fill

if TYPE_CHECKING:
    from trtllm_entrypoint.config.image_facts import ImageFacts
    from trtllm_entrypoint.config.settings import Settings
    from trtllm_entrypoint.launch.plan import ServePlan
    from trtllm_entrypoint.log import Log
    from trtllm_entrypoint.model.locate import ModelSource


def check_servable(settings: Settings, facts: ImageFacts) -> None:
    """LORA_DIR where no adapter can be served: refused first, before any download (one line, exit 2)."""
    if settings.lora_dir is not None:
        adapters.check_servable(
            settings.workflow, facts.features, facts.tag, facts.first_tag_with.get(adapters.FEATURE)
        )


def read(
    settings: Settings,
    source: ModelSource,
    base_config: Mapping[str, Any],
    log: Log,
    built_config: Mapping[str, Any] | None = None,
    model_dir: Path | None = None,
) -> tuple[tuple[Adapter, ...], tuple[str, ...]]:
    """Every adapter of LORA_DIR, checked against the base (and a prebuilt engine's LoRA build, `built_config`: its
    config.json's build_config) and numbered, and the engine's LoRA flags (EngineSpec.lora_flags); none without."""
    if settings.lora_dir is None:
        return (), ()
    if source.kind == "repository":
        raise UsageError(
            f"{adapters.VARIABLE} cannot be served with the complete model repository at {source.path}",
            f"give MODEL_ID a checkpoint or engine, or unset {adapters.VARIABLE}",
        )
    base = adapters.Base.from_config(base_config, source.repo_id)
    found = []
    for name, path in adapter_set.adapter_dirs(settings.lora_dir):
        adapter = adapters.read_adapter(path, name, settings.lora_max_rank)
        adapters.check_fits(adapter, base)
        found.append(dataclasses.replace(adapter, digest=content_digest(path, settings.cache.digests)))
    # Neither the front's name for the base model nor a Triton model's: clients would reach the wrong one.
    front_name = model_name.served_name(settings.served_model_name, settings.model_id, source, model_dir)
    adapter_set.check_names(found, [front_name, fill.served_name(settings, settings.workflow), *contract.ENGINE_MODELS])
    numbered = adapter_set.with_task_ids(found)
    build = adapter_set.lora_build(numbered, adapter_set.storage_dtype(settings.dtype, base_config))
    if built_config is not None and source.path is not None:
        adapter_set.check_prebuilt(built_config, build, source.path)
    for adapter in numbered:
        log.info(
            "adapter served",
            name=adapter.name,
            task_id=adapter.task_id,
            rank=adapter.rank,
            modules=",".join(sorted(adapter.target_modules)),
        )
    return numbered, tuple(build.argv())


def storage(settings: Settings) -> str:
    """The converted weights' dtype: the one the engine's --lora_plugin names (EngineSpec.lora_flags)."""
    flags = settings.lora_flags
    return flags[flags.index("--lora_plugin") + 1]


def fill_values(plan: ServePlan, facts: ImageFacts, env: Mapping[str, str], log: Log) -> dict[str, str]:
    """The adapters converted into the cache's prefetch layout (once per set), and the tensorrt_llm model's LoRA
    parameters pointing there; nothing without adapters."""
    if not plan.adapters:
        return {}
    settings = plan.settings
    dtype = storage(settings)
    prefetch = adapter_cache.ensure(
        plan.adapters,
        storage=dtype,
        tensorrt_llm=facts.tensorrt_llm,
        script=facts.app_dir / "examples" / "hf_lora_convert.py",
        cache_dir=settings.cache_dir,
        log=log,
        environ=env,
        timeout_s=settings.lock_timeout_secs,
    )
    return adapter_set.cache_parameters(plan.adapters, dtype, prefetch)
