"""The Triton model repository: fill the backend's templates, write them atomically, and check the result.

Works with every template version from tensorrtllm_backend v0.7.0 to TensorRT-LLM's triton_backend copy: the values
cover every placeholder we know, each file gets only the keys it contains, and whatever stays unfilled must be a
parameter we leave unset on purpose (the backend reads a `${x}` parameter string as "not given").

SERVED_MODEL_NAME names the entry point: the ensemble (engine workflow) or the single llmapi model is written to a
directory of that name with a matching `name:` field. The inner models keep their names, because the ensemble steps
and the BLS model (`tensorrt_llm_model_name`) refer to them by name.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from trtllm_entrypoint import contract, pbtxt
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.paths import open_lock, shared_dir, under_model_dir, within

if TYPE_CHECKING:
    from trtllm_entrypoint.facts import ImageFacts
    from trtllm_entrypoint.log import Log
    from trtllm_entrypoint.settings import Settings

ENGINE_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls", "ensemble")
ENTRY_MODEL = {"engine": "ensemble", "llmapi": "tensorrt_llm"}
WORKFLOW_DIR = {"engine": "inflight_batcher_llm", "llmapi": "llmapi"}
UNSET = "unset (backend default)"

# Parameter placeholders we leave as `${x}` on purpose: the backend then uses its own default (the C++ model wraps
# each optional parameter in try/catch, the Python models treat `${…}` as not given). Feature knobs we do not
# expose (LoRA, speculative decoding, multimodal, guided decoding, stats) and tuning whose default is right.
INTENTIONALLY_UNSET = frozenset({
    "add_special_tokens", "skip_special_tokens", "batch_scheduler_policy", "cancellation_check_period_ms",
    "cross_kv_cache_fraction", "cuda_graph_cache_size", "cuda_graph_mode", "decoding_mode", "eagle_choices",
    "enable_chunked_context", "enable_context_fmha_fp32_acc", "enable_trt_overlap", "encoder_engine_dir",
    "gpu_device_ids", "gpu_weights_percent", "guided_decoding_backend", "hf_model_path", "iter_stats_max_iterations",
    "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks", "lookahead_ngram_size",
    "lookahead_verification_set_size", "lookahead_window_size", "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes", "lora_cache_max_adapter_size", "lora_cache_optimal_adapter_size",
    "lora_prefetch_dir", "max_attention_window_size", "max_kv_cache_length", "max_num_images", "max_num_sequences",
    "max_tokens_in_paged_kv_cache", "medusa_choices", "multi_block_mode", "multimodal_encoders_name",
    "multimodal_model_path", "normalize_log_probs", "num_nodes", "participant_ids", "request_stats_max_iterations",
    "sink_token_length", "speculative_decoding_fast_logits", "stats_check_period_ms",
    "tensorrt_llm_draft_model_name", "visual_model_path", "xgrammar_tokenizer_info_path",
})

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_STRING_VALUE = re.compile(r'string_value\s*:\s*"(?:[^"\\\n]|\\.)*"')
_TOP_NAME = re.compile(r'^name\s*:\s*"[^"\n]*"', re.MULTILINE)


@dataclass(frozen=True)
class ModelFill:
    source: str               # template model directory, relative to the template root
    name: str                 # directory and model name in the written repository
    files: dict[str, str]     # relative path inside the model directory -> text to write


@dataclass(frozen=True)
class FillPlan:
    workflow: str
    models: tuple[ModelFill, ...]
    effective: dict[str, str] = field(default_factory=dict)  # optional parameter -> value or UNSET, for the log


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


def fill_values(settings: Settings, facts: ImageFacts, engine_dir: Path | None,
                tokenizer_dir: Path) -> dict[str, str]:
    """The value of every placeholder we fill, as text of the right type for where the templates put it."""
    values = {
        # structural: protobuf fields
        "triton_max_batch_size": str(settings.max_batch_size),
        "decoupled_mode": _flag(settings.decoupled),
        "max_queue_delay_microseconds": "0",
        "max_queue_size": "0",
        # Pre/postprocessing from the usable CPUs (settings); the BLS model is not our entry point.
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
    }
    if engine_dir is not None:  # left out, a template that needs it fails in plan_fill with the name
        values["engine_dir"] = str(engine_dir)
    return values


def _pbtxt_escape(value: str) -> str:
    """Values land inside quoted strings (paths) or as bare tokens (numbers, enums): escape for the former."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(text: str, values: Mapping[str, str]) -> str:
    """Substitute the placeholders that have a value; like newer fill_template, never touches unknown ones."""
    return _PLACEHOLDER.sub(lambda m: _pbtxt_escape(values[m.group(1)]) if m.group(1) in values else m.group(0),
                            text)


def rename_model(text: str, name: str) -> str:
    renamed, count = _TOP_NAME.subn(f'name: "{name}"', text, count=1)
    if not count:
        raise EntrypointError("the entry model's config.pbtxt has no top-level `name:` line to rename",
                              "unset SERVED_MODEL_NAME, or check the templates")
    return renamed


def served_name(settings: Settings, workflow: str, inner: tuple[str, ...]) -> str:
    """SERVED_MODEL_NAME (its form is checked by settings), or the template's entry model name."""
    name = settings.served_model_name or ENTRY_MODEL[workflow]
    if name != ENTRY_MODEL[workflow] and name in inner:
        raise UsageError(f"SERVED_MODEL_NAME={name!r} clashes with an inner model of the repository",
                         "choose a name other than " + ", ".join(inner))
    return name


def _fill_config(path: Path, values: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """(rendered text, effective optional parameters); fails when something stays unfilled by mistake."""
    text = path.read_text()
    rendered = render(text, {k: v for k, v in values.items() if k in placeholders(text)})
    stuck, unknown = unfilled(rendered)
    if stuck:
        raise EntrypointError(f"{path}: no value for the required placeholder(s) {', '.join(sorted(stuck))}",
                              "these templates are newer than this entrypoint knows; set TEMPLATES_DIR to "
                              "templates of the installed backend, or report the names")
    if unknown:
        raise EntrypointError(f"{path}: parameter placeholder(s) {', '.join(sorted(unknown))} would stay unfilled",
                              "these templates are newer than this entrypoint knows; report the names")
    optional = _active_placeholders(text) - structural_placeholders(text)
    return rendered, {name: values.get(name, UNSET) for name in optional}


def _engine_models(root: Path, values: Mapping[str, str], settings: Settings) -> tuple[list[ModelFill], dict[str, str]]:
    present = [m for m in ENGINE_MODELS if (root / m / "config.pbtxt").is_file()]
    missing = {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble"} - set(present)
    if missing:
        raise EntrypointError(f"{root} lacks the template model(s) {', '.join(sorted(missing))}",
                              "set TEMPLATES_DIR to the backend's all_models directory")
    entry = served_name(settings, "engine", tuple(m for m in present if m != "ensemble"))
    models, effective = [], {}
    for model in present:
        text, model_effective = _fill_config(root / model / "config.pbtxt", values)
        effective.update(model_effective)
        name = entry if model == "ensemble" else model
        if name != model:
            text = rename_model(text, name)
        models.append(ModelFill(f"{WORKFLOW_DIR['engine']}/{model}", name, {"config.pbtxt": text}))
    return models, effective


def llmapi_config(settings: Settings, model_path: Path | str) -> dict:
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


def _llmapi_models(root: Path, settings: Settings, model_path: Path | str | None) -> tuple[list[ModelFill], dict]:
    config_path = root / "tensorrt_llm" / "config.pbtxt"
    if not config_path.is_file():
        raise EntrypointError(f"{root} has no tensorrt_llm/config.pbtxt", "set TEMPLATES_DIR to the backend's "
                              "all_models directory of a version with the llmapi model (TensorRT-LLM 0.19 or later)")
    if model_path is None:
        raise EntrypointError("the llmapi workflow needs the model's path for model.yaml")
    text, _ = _fill_config(config_path, {})
    name = served_name(settings, "llmapi", ())
    if name != "tensorrt_llm":
        text = rename_model(text, name)
    config = llmapi_config(settings, model_path)
    files = {"config.pbtxt": text, "1/model.yaml": to_yaml(config)}
    return [ModelFill(f"{WORKFLOW_DIR['llmapi']}/tensorrt_llm", name, files)], _flatten(config)


def plan_fill(template_root: Path, values: Mapping[str, str], *, settings: Settings,
              model_path: Path | str | None = None) -> FillPlan:
    """What to write for settings.workflow; reads the templates under template_root (the backend's all_models)."""
    workflow = settings.workflow
    root = Path(template_root) / WORKFLOW_DIR[workflow]
    if workflow == "engine":
        models, effective = _engine_models(root, values, settings)
    else:
        models, effective = _llmapi_models(root, settings, model_path)
    return FillPlan(workflow, tuple(models), dict(sorted(effective.items())))


def _check_destination(dest: Path, template_root: Path) -> None:
    if under_model_dir(dest):
        raise UsageError(f"refusing to write the model repository to {dest}: {contract.KSERVE_MODEL_DIR} is "
                         "KServe's read-only model mount",
                         "set REPOSITORY_DIR to a writable directory such as /tmp/model-repository")
    if within(dest, template_root) or within(template_root, dest):
        raise UsageError(f"refusing to write the model repository to {dest}: it overlaps the templates at "
                         f"{template_root}", "set REPOSITORY_DIR to a directory outside TEMPLATES_DIR")


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a template model directory; copies are owner-writable even when the source is read-only."""
    target.mkdir(mode=0o755)
    for entry in sorted(source.iterdir()):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            _copy_tree(entry, target / entry.name)
        else:
            shutil.copyfile(entry, target / entry.name)
            os.chmod(target / entry.name, (entry.stat().st_mode & 0o777) | 0o600)


def plan_digest(plan: FillPlan, template_root: Path) -> str:
    """Names the repository a plan writes: same templates and values, same digest, so it can be reused."""
    # The copied template files (model.py …) count too: a new image on an old cache must not reuse old code.
    # By content, not mtime, so templates copied anew per pod still name the same repository.
    copied = sorted((str(f.relative_to(template_root)), hashlib.sha256(f.read_bytes()).hexdigest())
                    for m in plan.models for f in (template_root / m.source).rglob("*")
                    if f.is_file() and "__pycache__" not in f.parts)
    content = {"templates": str(template_root), "workflow": plan.workflow, "copied": copied,
               "models": [[m.source, m.name, sorted(m.files.items())] for m in plan.models]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:20]


def write_repository(plan: FillPlan, dest: Path, template_root: Path, log: Log | None = None, *,
                     replace: bool = True) -> bool:
    """Build the repository in a temp dir beside dest, validate it, then swap it in (a crash leaves dest intact).

    With replace=False dest is content-addressed: an existing one is kept, and concurrent writers of the same dest
    (replicas on a shared cache) take turns, so one writes and validates while the others reuse. True if written."""
    dest = Path(os.path.abspath(dest))
    template_root = Path(os.path.abspath(template_root))
    _check_destination(dest, template_root)
    if replace:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _write(plan, dest, template_root, log)
        return True
    if dest.is_dir():
        return False
    shared_dir(dest.parent)
    fd = open_lock(dest.parent / f".{dest.name}.lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released on close, or by the kernel if we are killed
        if dest.is_dir():
            return False
        for debris in dest.parent.glob(f".{dest.name}.new-*"):  # a killed writer's, since we hold the lock
            shutil.rmtree(debris, ignore_errors=True)
        _write(plan, dest, template_root, log)
        return True
    finally:
        os.close(fd)


def _write(plan: FillPlan, dest: Path, template_root: Path, log: Log | None) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.new-", dir=dest.parent))
    try:
        for model in plan.models:
            _copy_tree(template_root / model.source, staging / model.name)
            for relative, text in model.files.items():
                target = staging / model.name / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        validate_repository(staging, log=log)
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide it from replicas under other UIDs
        _swap_in(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_in(staging: Path, dest: Path) -> None:
    """Two renames; an earlier repository at dest is moved aside first and removed afterwards."""
    old = None
    if dest.exists() or dest.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent)) / "repository"
        os.rename(dest, old)
    os.rename(staging, dest)
    if old is not None:
        shutil.rmtree(old.parent, ignore_errors=True)


def _load_configs(root: Path) -> dict[str, tuple[Path, str, dict]]:
    configs = {}
    for path in sorted(root.glob("*/config.pbtxt")):
        text = path.read_text()
        stuck = structural_placeholders(text)
        if stuck:
            raise EntrypointError(f"{path}: unfilled required placeholder(s) {', '.join(sorted(stuck))}",
                                  "fill them (see the backend's docs/model_config.md) before serving")
        parsed = pbtxt.parse(text, str(path))
        if parsed.get("name", path.parent.name) != path.parent.name:
            raise EntrypointError(f"{path}: name {parsed.get('name')!r} differs from its directory "
                                  f"{path.parent.name!r}", "Triton requires them to match")
        configs[path.parent.name] = (path, text, parsed)
    if not configs:
        raise EntrypointError(f"{root} holds no model (no */config.pbtxt)")
    return configs


def _model_config_class():
    """Triton's ModelConfig message from tritonclient, or None where it is not installed.

    Loaded from its file: importing `tritonclient.grpc` would import grpc too, which costs more than the check."""
    try:
        spec = importlib.util.find_spec("tritonclient")
        protobuf = importlib.util.find_spec("google.protobuf")
    except (ImportError, ValueError):
        return None
    if spec is None or protobuf is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "grpc" / "model_config_pb2.py"
    name = "tritonclient.grpc.model_config_pb2"
    module = sys.modules.get(name)
    if module is None and path.is_file():
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        sys.modules[name] = module
    return getattr(module, "ModelConfig", None)


def _check_protobuf(configs: Mapping[str, tuple[Path, str, dict]], log: Log | None) -> None:
    model_config = _model_config_class()
    if model_config is None:
        if log is not None:
            log.info("protobuf check skipped: tritonclient is not installed")
        return
    from google.protobuf import text_format
    for path, text, _ in configs.values():
        try:
            text_format.Parse(text, model_config())
        except text_format.ParseError as exc:
            raise EntrypointError(f"{path}: not a valid Triton ModelConfig: {exc}") from None


def _check_ensemble(name: str, parsed: dict, configs: Mapping[str, tuple[Path, str, dict]]) -> None:
    used_inputs, produced = set(), set()
    for step in parsed.get("ensemble_scheduling", {}).get("step", []):
        model = step.get("model_name")
        if model not in configs:
            raise EntrypointError(f"ensemble {name!r} has a step for model {model!r}, which is not in the repository")
        step_config = configs[model][2]
        for kind, tensors, declared in (("input", step.get("input_map"), step_config.get("input")),
                                        ("output", step.get("output_map"), step_config.get("output"))):
            mapping = pbtxt.map_entries(tensors)
            wrong = set(mapping) - set(pbtxt.names(declared))
            if wrong:
                raise EntrypointError(f"ensemble {name!r} maps {kind}(s) {', '.join(sorted(wrong))} of model "
                                      f"{model!r}, which declares no such {kind}")
            (used_inputs if kind == "input" else produced).update(mapping.values())
    unused = set(pbtxt.names(parsed.get("input"))) - used_inputs
    unproduced = set(pbtxt.names(parsed.get("output"))) - produced
    if unused or unproduced:
        raise EntrypointError(f"ensemble {name!r} wiring is incomplete: inputs never used "
                              f"{sorted(unused)}, outputs never produced {sorted(unproduced)}")


def validate_repository(root: Path, log: Log | None = None) -> None:
    """No required placeholder left, every config parses (with protobuf when installed), ensembles are wired."""
    configs = _load_configs(Path(root))
    _check_protobuf(configs, log)
    for name, (_, _, parsed) in configs.items():
        if parsed.get("platform") == "ensemble":
            _check_ensemble(name, parsed, configs)
