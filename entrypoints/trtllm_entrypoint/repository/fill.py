"""Filling the backend's `config.pbtxt` templates: the value of every placeholder, and what each model gets.

Works with every template version from tensorrtllm_backend v0.7.0 to TensorRT-LLM's triton_backend copy: the values
cover every placeholder we know, each file gets only the keys it contains, and whatever stays unfilled must be a
parameter we leave unset on purpose (the backend reads a `${x}` parameter string as "not given").

SERVED_MODEL_NAME names the entry point: the ensemble (engine workflow) or the single llmapi model is written to a
directory of that name with a matching `name:` field. The inner models keep their names, because the ensemble steps
and the BLS model (`tensorrt_llm_model_name`) refer to them by name. Pure: reads the templates, writes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.image_facts import ImageFacts
from trtllm_entrypoint.config.settings import SERVED_NAME, Settings
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.repository.parameters import BACKEND_DEFAULTS, INTENTIONALLY_UNSET, PARAMETER_SETTINGS

WORKFLOW_DIR = {"engine": "inflight_batcher_llm", "llmapi": "llmapi"}
UNSET = "unset (backend default)"

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_STRING_VALUE = re.compile(r'string_value\s*:\s*"(?:[^"\\\n]|\\.)*"')
_TOP_NAME = re.compile(r'^name\s*:\s*"[^"\n]*"', re.MULTILINE)


@dataclass(frozen=True)
class ModelFill:
    source: str  # template model directory, relative to TEMPLATES_DIR
    name: str  # directory and model name in the written repository
    files: dict[str, str]  # relative path inside the model directory -> text to write


@dataclass(frozen=True)
class FillPlan:
    workflow: str
    models: tuple[ModelFill, ...]
    effective: dict[str, str] = field(default_factory=dict)  # optional parameter -> value or UNSET, for the log


def parameter_summary(effective: Mapping[str, str], explicit: frozenset[str]) -> dict[str, object]:
    """The short form of `effective` for the start-up log: the parameters whose variable the user set, and how
    many the image's defaults and the backend's defaults decide."""
    user_set = {k: v for k, v in effective.items() if PARAMETER_SETTINGS.get(k) in explicit}
    backend = sum(1 for v in effective.values() if v == UNSET)
    return {**user_set, "image_defaults": len(effective) - len(user_set) - backend, "backend_defaults": backend}


def _strip_comments(text: str) -> str:
    """The text with every `#` comment removed (a `#` inside a quoted string is kept)."""
    lines = []
    for line in text.split("\n"):
        if "#" not in line:
            lines.append(line)
            continue
        quote = None
        escaped = False
        for i, ch in enumerate(line):
            if escaped:
                escaped = False
            elif ch == "\\" and quote:
                escaped = True
            elif ch in "\"'" and quote in (None, ch):
                quote = None if quote else ch
            elif ch == "#" and not quote:
                line = line[:i]
                break
        lines.append(line)
    return "\n".join(lines)


def placeholders(text: str) -> set[str]:
    """Every `${name}` in the text, commented-out ones included."""
    return set(_PLACEHOLDER.findall(text))


def structural_placeholders(text: str) -> set[str]:
    """Placeholders outside a `string_value: "…"`: left unfilled they make the file invalid. Comments are ignored."""
    outside = _STRING_VALUE.sub('string_value: ""', _strip_comments(text))
    return set(_PLACEHOLDER.findall(outside))


def _active_placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(_strip_comments(text)))


def unfilled(text: str) -> tuple[set[str], set[str]]:
    """(structural, parameter) placeholders left that make a config unusable; the parameters we leave unset on
    purpose (the backend reads `${x}` there as "use the default") are fine."""
    return structural_placeholders(text), _active_placeholders(text) - INTENTIONALLY_UNSET


def _flag(value: bool) -> str:
    return "true" if value else "false"


def fill_values(settings: Settings, facts: ImageFacts, engine_dir: Path | None, tokenizer_dir: Path) -> dict[str, str]:
    """The value of every placeholder we fill, as text of the right type for where the templates put it."""
    values = {
        # structural: protobuf fields
        "triton_max_batch_size": str(settings.max_batch_size),
        "decoupled_mode": _flag(settings.decoupled),
        "max_queue_delay_microseconds": "0",
        "max_queue_size": "0",
        # Pre/postprocessing from the usable CPUs (settings, cpus.py); the BLS model is not our entry point.
        "preprocessing_instance_count": str(settings.preprocessing_instances),
        "postprocessing_instance_count": str(settings.postprocessing_instances),
        "bls_instance_count": "1",
        "logits_datatype": "TYPE_FP32",
        "encoder_input_features_data_type": "TYPE_FP16",
        "prompt_embedding_table_data_type": "TYPE_FP16",
        "triton_backend": "tensorrtllm",
        # parameters: strings the models parse
        "tokenizer_dir": str(tokenizer_dir),
        "tokenizer_type": "auto",  # pre/postprocessing before v0.9: AutoTokenizer
        "max_beam_width": str(settings.max_beam_width),
        "batching_strategy": "inflight_fused_batching",
        "kv_cache_free_gpu_mem_fraction": repr(float(settings.kv_cache_free_gpu_mem_fraction)),
        "enable_kv_cache_reuse": _flag(settings.enable_kv_cache_reuse),
        "exclude_input_in_output": "true",
        "accumulate_tokens": "false",
        "tensorrt_llm_model_name": "tensorrt_llm",
        **BACKEND_DEFAULTS,
    }
    if engine_dir is not None:  # left out, a template that needs it fails in plan_fill with the name
        values["engine_dir"] = str(engine_dir)
    return values


def guided_values(tokenizer_info: Path) -> dict[str, str]:
    """The values that turn guided decoding on in the tensorrt_llm model (v0.19.0 on; older templates have neither
    placeholder), given the tokenizer-info file (repository/xgrammar_info.py). Without them both stay unset, which
    the backend reads as off."""
    return {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(tokenizer_info)}


def _pbtxt_escape(value: str) -> str:
    """Values land inside quoted strings (paths) or as bare tokens (numbers, enums): escape for the former."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(text: str, values: Mapping[str, str]) -> str:
    """Substitute the placeholders that have a value; like newer fill_template, never touches unknown ones."""
    return _PLACEHOLDER.sub(lambda m: _pbtxt_escape(values[m.group(1)]) if m.group(1) in values else m.group(0), text)


def rename_model(text: str, name: str) -> str:
    renamed, count = _TOP_NAME.subn(f'name: "{name}"', text, count=1)
    if not count:
        raise EntrypointError(
            "the entry model's config.pbtxt has no top-level `name:` line to rename",
            "unset SERVED_MODEL_NAME, or check the templates",
        )
    return renamed


def served_name(settings: Settings, workflow: str) -> str:
    """The entry model's name in the repository: SERVED_MODEL_NAME where it is a Triton model name (settings checked
    its form and that no inner model has it; an OpenAI name such as `org/name` is not one), else the workflow's."""
    name = settings.served_model_name
    return name if name and SERVED_NAME.fullmatch(name) else contract.ENTRY_MODEL[workflow]


def workflow_templates(templates_dir: Path, workflow: str) -> Path:
    """The folder with the workflow's model templates. TEMPLATES_DIR names the backend's all_models (as the images
    ship it) or that folder itself (all_models/inflight_batcher_llm is what the seeds copy)."""
    nested = templates_dir / WORKFLOW_DIR[workflow]
    if nested.is_dir():
        return nested
    entry = contract.ENTRY_MODEL[workflow]
    # An inflight_batcher_llm folder has a tensorrt_llm model too: only one without an ensemble is an llmapi folder.
    if (templates_dir / entry / "config.pbtxt").is_file() and (
        workflow == "engine" or not (templates_dir / "ensemble").exists()
    ):
        return templates_dir
    found = "does not exist" if not templates_dir.exists() else f"has neither {WORKFLOW_DIR[workflow]}/ nor {entry}/"
    raise UsageError(
        f"TEMPLATES_DIR={str(templates_dir)!r} is not allowed: it {found}; expected the backend's "
        f"all_models directory or its {WORKFLOW_DIR[workflow]} folder (WORKFLOW={workflow})",
        "leave TEMPLATES_DIR unset to use the image's templates",
    )


def _fill_config(path: Path, values: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """(rendered text, effective optional parameters); fails when something stays unfilled by mistake."""
    text = path.read_text()
    rendered = render(text, {k: v for k, v in values.items() if k in placeholders(text)})
    stuck, unknown = unfilled(rendered)
    if stuck:
        raise EntrypointError(
            f"{path}: no value for the required placeholder(s) {', '.join(sorted(stuck))}",
            "these templates are newer than this entrypoint knows; set TEMPLATES_DIR to "
            "templates of the installed backend, or report the names",
        )
    if unknown:
        raise EntrypointError(
            f"{path}: parameter placeholder(s) {', '.join(sorted(unknown))} would stay unfilled",
            "these templates are newer than this entrypoint knows; report the names",
        )
    optional = _active_placeholders(text) - structural_placeholders(text)
    return rendered, {name: values.get(name, UNSET) for name in optional}


def _engine_models(root: Path, values: Mapping[str, str], settings: Settings) -> tuple[list[ModelFill], dict[str, str]]:
    # The BLS model is opt-in: it imports torch (slower start), and when it fails to load Triton starts no model.
    wanted = [m for m in contract.ENGINE_MODELS if m != "tensorrt_llm_bls" or settings.enable_bls]
    present = [m for m in wanted if (root / m / "config.pbtxt").is_file()]
    missing = {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble"} - set(present)
    if missing:
        raise EntrypointError(
            f"{root} lacks the template model(s) {', '.join(sorted(missing))}",
            "set TEMPLATES_DIR to the backend's all_models directory",
        )
    entry = served_name(settings, "engine")
    models, effective = [], {}
    for model in present:
        text, model_effective = _fill_config(root / model / "config.pbtxt", values)
        effective.update(model_effective)
        name = entry if model == "ensemble" else model
        if name != model:
            text = rename_model(text, name)
        models.append(ModelFill(model, name, {"config.pbtxt": text}))
    return models, effective


def llmapi_config(settings: Settings, model_path: Path | str) -> dict[str, Any]:
    """model.yaml for the llmapi model: LLM() arguments, plus the `triton_config` its model.py reads."""
    return {
        "model": str(model_path),
        "backend": "pytorch",
        "tensor_parallel_size": settings.tp_size,
        "pipeline_parallel_size": settings.pp_size,
        "dtype": settings.dtype,
        "max_batch_size": settings.max_batch_size,
        "max_num_tokens": settings.max_num_tokens,
        "max_seq_len": settings.max_seq_len,
        "kv_cache_config": {
            "free_gpu_memory_fraction": float(settings.kv_cache_free_gpu_mem_fraction),
            "enable_block_reuse": bool(settings.enable_kv_cache_reuse),
        },
        # The model does its own in-flight batching; Triton-side batching stays off, as in the upstream model.yaml.
        "triton_config": {"max_batch_size": 0, "decoupled": bool(settings.decoupled)},
    }


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return _flag(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # fixed notation: YAML 1.1 readers take `1e-05` for a string
        text = f"{value:.12f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    return json.dumps(str(value))  # a JSON string is a valid YAML double-quoted scalar


def to_yaml(mapping: Mapping[str, Any], indent: int = 0) -> str:
    """Block YAML for nested maps of scalars."""
    lines = []
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            lines.append(" " * indent + f"{key}:")
            lines.append(to_yaml(value, indent + 2).rstrip("\n"))
        else:
            lines.append(" " * indent + f"{key}: {_yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = _yaml_scalar(value)
    return flat


def _llmapi_models(
    root: Path, settings: Settings, model_path: Path | str | None
) -> tuple[list[ModelFill], dict[str, Any]]:
    config_path = root / "tensorrt_llm" / "config.pbtxt"
    if not config_path.is_file():
        raise EntrypointError(
            f"{root} has no tensorrt_llm/config.pbtxt",
            "set TEMPLATES_DIR to the backend's "
            "all_models directory of a version with the llmapi model (TensorRT-LLM 0.19 or later)",
        )
    if model_path is None:
        raise EntrypointError("the llmapi workflow needs the model's path for model.yaml")
    text, _ = _fill_config(config_path, {})
    name = served_name(settings, "llmapi")
    if name != "tensorrt_llm":
        text = rename_model(text, name)
    config = llmapi_config(settings, model_path)
    files = {"config.pbtxt": text, "1/model.yaml": to_yaml(config)}
    return [ModelFill("tensorrt_llm", name, files)], _flatten(config)


def plan_fill(
    template_root: Path, values: Mapping[str, str], *, settings: Settings, model_path: Path | str | None = None
) -> FillPlan:
    """What to write for settings.workflow; reads the templates under template_root (TEMPLATES_DIR)."""
    workflow = settings.workflow
    root = workflow_templates(Path(template_root), workflow)
    if workflow == "engine":
        models, effective = _engine_models(root, values, settings)
    else:
        models, effective = _llmapi_models(root, settings, model_path)
    # Sources relative to template_root, whichever of its two layouts TEMPLATES_DIR has.
    prefix = root.relative_to(template_root)
    models = [dataclasses.replace(m, source=(prefix / m.source).as_posix()) for m in models]
    return FillPlan(workflow, tuple(models), dict(sorted(effective.items())))
