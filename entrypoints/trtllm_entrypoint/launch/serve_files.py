"""What the server loads, on disk: the engine (the plan's prebuilt one, or one built once into the cache under a lock)
and the filled Triton model repository (named, or cached by its content)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from trtllm_entrypoint.config import gpu
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.engine import build as engine_build
from trtllm_entrypoint.engine import cache as engine_cache
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.launch.plan import ServePlan
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.model import locate
from trtllm_entrypoint.model import support as models
from trtllm_entrypoint.repository import fill, xgrammar_info
from trtllm_entrypoint.repository import write as repository
from trtllm_entrypoint.storage import trust


def ensure_engine(
    plan: ServePlan, facts: ImageFacts, env: Mapping[str, str], log: Log, detect_gpus: Callable[[], gpu.GpuInfo]
) -> Path:
    """The plan's prebuilt engine, or the one from the cache (built once, under a lock; the build runs with `env`)."""
    settings, source = plan.settings, plan.model
    if plan.engine == "prebuilt" and source.path is not None:
        log.info("using the prebuilt engine", engine_dir=source.path)
        return source.path
    if source.kind != "checkpoint" or source.path is None or plan.converter is None:  # checkpoints have one looked up
        raise UsageError(
            f"the {source.kind} at {source.path} cannot be turned into an engine",
            "give MODEL_ID a Hugging Face checkpoint, or ENGINE_DIR a prebuilt engine",
        )
    converter = models.required(plan.converter)
    gpus = detect_gpus()
    # Engines are specific to the GPU's compute capability, so building needs one (ranks are built one by one).
    gpu.require_gpus(gpus, 1, "to build a TensorRT engine")
    spec = settings.engine_spec  # all the build reads, and so all the key needs
    inputs = engine_cache.key_inputs(locate.identity(source, settings.cache.digests), spec, facts, gpus)
    key = engine_cache.cache_key(inputs)
    cache = engine_cache.EngineCache(settings.cache.engines)
    build = engine_build.engine_builder(facts, spec, source.path, converter, log, env)
    with log.phase("engine", key=key) as extra:
        engine_dir, built = cache.ensure(
            key,
            engine_cache.stamp_inputs(inputs, facts, gpus, source.path),
            build,
            timeout_s=settings.lock_timeout_secs,
            log=log,
        )
        extra.update(cache="built" if built else "hit", engine_dir=engine_dir)
    return engine_dir


def guided_decoding(serve: ServePlan, facts: ImageFacts, log: Log) -> tuple[dict[str, str], str]:
    """Guided decoding where the served models take a guide per request (the engine workflow, from the capability
    on): the placeholder values that point the tensorrt_llm model at the tokenizer-info file the C++ backend needs
    (made once into the cache); and why it is off otherwise (the OpenAI front's 400 says it). A tokenizer that gives
    no file turns it off with a warning, never stops the start."""
    first = facts.first_tag_with.get(xgrammar_info.FEATURE)
    problem = None
    info = None
    if serve.workflow == "engine" and xgrammar_info.FEATURE in facts.features and serve.tokenizer is not None:
        try:
            info = xgrammar_info.ensure(serve.settings.cache.tokenizer_info, serve.tokenizer)
            log.info("guided decoding is on (xgrammar)", tokenizer_info=str(info))
        except (xgrammar_info.NoTokenizerInfo, OSError) as exc:
            problem = str(exc)
            log.warn("guided decoding is off: no tokenizer info for the backend", reason=problem)
    off = xgrammar_info.guided_off(facts.features, serve.workflow, facts.tag, first, problem)
    return ({} if info is None else fill.guided_values(info)), off


def write_repository(
    serve: ServePlan, facts: ImageFacts, log: Log, engine_dir: Path | None, extra: Mapping[str, str] | None = None
) -> Path:
    """The plan's repository, filled: REPOSITORY_DIR as named, or below the cache's repositories by its content.
    `extra`: more placeholder values (the LoRA adapters' prefetch directory and cache sizes, launch/lora.py)."""
    settings = serve.settings
    if serve.tokenizer is None:
        raise EntrypointError("a repository to fill needs the tokenizer the plan found", "report this as a bug")
    values = {**fill.fill_values(settings, facts, engine_dir, serve.tokenizer), **(extra or {})}
    plan = fill.plan_fill(settings.templates_dir, values, settings=settings, model_path=serve.model.path)
    log.info(
        "template parameters you set (LOG_LEVEL=debug or `trtllm-entrypoint check` lists every one)",
        **fill.parameter_summary(plan.effective, settings.explicit),
    )
    log.debug("optional template parameters", **plan.effective)
    if settings.repository_dir:
        # The returned lock descriptor stays open on purpose: the exec'd server inherits it and holds it while serving.
        repository.write_named(
            plan, serve.repository, settings.templates_dir, log, timeout_s=settings.lock_timeout_secs
        )
        return serve.repository
    # Named by its content below the plan's: a restart with the same settings finds it valid and skips the write.
    dest, _ = repository.write_cached(
        plan, serve.repository, settings.templates_dir, log, timeout_s=settings.lock_timeout_secs
    )
    return dest


def warn_open_cache(cache_dir: Path, log: Log) -> None:
    """What the cache serves is checked, then loaded by path: a directory above it in which another UID can rename
    entries lets that UID swap the checked tree for another in between."""
    open_dirs = trust.open_ancestors(cache_dir)
    if open_dirs:
        log.warn(
            "another UID can rename entries in a directory above CACHE_DIR, so it could swap what the cache "
            "serves after the check: make it sticky (chmod +t) or writable by this UID alone",
            dirs=", ".join(map(str, open_dirs)),
        )
