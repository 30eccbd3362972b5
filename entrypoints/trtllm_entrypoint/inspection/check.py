"""`check`: what the image, the GPUs and the settings are, and whether they can serve, printed as JSON; non-zero when
the image and the matrix disagree, the templates do not fit the workflow, too few GPUs are visible or the checkpoint
is not served. Nothing is downloaded or written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from trtllm_entrypoint.config import gpu
from trtllm_entrypoint.config.image_facts import ImageFacts, installation
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.inspection import probe
from trtllm_entrypoint.launch import lora
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.model import hub, locate
from trtllm_entrypoint.model import support as models
from trtllm_entrypoint.repository import fill


def check(settings: Settings, facts: ImageFacts, env: Mapping[str, str], log: Log) -> int:
    """Print what was detected and resolved; non-zero when the image and the matrix disagree."""
    gpus = gpu.detect_gpus(settings.gpu_visibility)
    model = model_support(settings, facts)
    lora_report = served_adapters(settings, facts, log)
    report = {
        "facts": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(facts).items()},
        "gpus": [dataclasses.asdict(g) for g in gpus.gpus],
        "settings": settings.describe(),
        "installed": probe.probe(installation(env, facts)),
        "model": model,
        "template_parameters": template_parameters(settings, facts),
        "adapters": lora_report,
    }
    print(json.dumps(report, indent=2, default=str))
    problems = compatibility_problems(facts, settings, gpus)
    if model is not None and isinstance(model["problem"], str):
        problems.append(model["problem"])
    if lora_report is not None and "problem" in lora_report:
        problems.append(str(lora_report["problem"]))
    for problem in problems:
        log.error(problem)
    return 1 if problems else 0


def model_support(settings: Settings, facts: ImageFacts) -> dict[str, object] | None:
    """Whether this image serves the configured checkpoint with its workflow (None: no checkpoint is configured)."""
    try:
        source = locate.resolve(settings)
    except UsageError:
        return None
    if source.kind not in ("hub", "checkpoint"):
        return None
    config = hub.read_config(source, settings)
    return {
        "model": models.describe(config),
        "workflow": settings.workflow,
        "problem": models.unsupported_reason(models.load(facts.models_file), config, facts, settings.workflow),
    }


def served_adapters(settings: Settings, facts: ImageFacts, log: Log) -> dict[str, object] | None:
    """LORA_DIR's adapters as a start would serve them (name -> task id, the engine's LoRA flags), or the one line
    a start would refuse them with (None without LORA_DIR). Reads the adapters and the model's config.json only."""
    if settings.lora_dir is None:
        return None
    try:
        lora.check_servable(settings, facts)
        source = locate.resolve(settings)
        config = hub.read_config(source, settings) if source.kind in ("hub", "checkpoint") else {}
        found, flags = lora.read(settings, source, config, log, model_dir=locate.model_id_dir(settings))
    except UsageError as exc:
        return {"problem": exc.message}
    return {"task_ids": {a.name: a.task_id for a in found}, "engine_flags": list(flags)}


def template_parameters(settings: Settings, facts: ImageFacts) -> dict[str, str] | str:
    """Every optional template parameter with the value a start would fill in (the start-up log shows only the
    ones set by the user), or why the templates cannot be filled; paths decided at start are shown as such."""
    later = Path("<decided at start>")
    try:
        values = fill.fill_values(settings, facts, settings.engine_dir or later, later)
        plan = fill.plan_fill(settings.templates_dir, values, settings=settings, model_path=settings.model_id or later)
    except EntrypointError as exc:
        return exc.message
    return plan.effective


def compatibility_problems(facts: ImageFacts, settings: Settings, gpus: gpu.GpuInfo) -> list[str]:
    problems = []
    if facts.installed and facts.tensorrt_llm != facts.matrix_tensorrt_llm:
        problems.append(
            f"installed TensorRT-LLM {facts.tensorrt_llm} differs from {facts.matrix_tensorrt_llm} that "
            f"the matrix gives for {facts.tag}"
        )
    try:
        fill.workflow_templates(settings.templates_dir, settings.workflow)
    except UsageError as exc:
        problems.append(exc.message)
    if gpus.count < settings.world_size:
        problems.append(
            f"TP_SIZE x PP_SIZE = {settings.world_size} needs {settings.world_size} GPUs, {gpus.count} visible"
        )
    return problems
