"""Load and validate models.yaml: which model types each release serves, and with which converter arguments; the
`models.json` the images carry and `build.py models` shows, and the image data files together."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint.errors import UsageError
from trtllm_images.capabilities import (
    LAYOUTS,
    Capabilities,
    Rule,
    TagCapabilities,
    load_capabilities,
    parse_rule,
)
from trtllm_images.datafile import ROOT, expect_mapping, expect_strings, expect_version, raise_problems, read_yaml
from trtllm_images.matrix import image_matrix_json

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix, MatrixEntry

MODELS_PATH = ROOT / "models.yaml"
MODEL_KEYS = ("model_type", "aliases", "architectures", "engine", "llmapi", "uncertain", "sources")
MODEL_REQUIRED = ("model_type", "architectures", "engine", "llmapi", "sources")
ENGINE_KEYS = ("since", "folder", "args")
UNCERTAIN_MODEL_KEYS = ("engine", "engine.args", "llmapi")


@dataclass(frozen=True)
class ArgsRule:
    args: tuple[str, ...]
    rule: Rule


@dataclass(frozen=True)
class Engine:
    since: str
    folders: Mapping[str, str] = field(hash=False)  # examples layout -> folder under examples/ (or examples/models/)
    args: tuple[ArgsRule, ...] = ()


@dataclass(frozen=True)
class ModelSupport:
    model_type: str
    aliases: tuple[str, ...]
    architectures: tuple[str, ...]
    engine: Engine | None
    llmapi_since: str | None
    uncertain: Mapping[str, str] = field(hash=False)
    sources: tuple[str, ...] = ()

    def converter_dir(self, layout: str) -> str:
        """Where this model's convert_checkpoint.py is in an image with `layout` (container side: models.py)."""
        if self.engine is None:
            raise ValueError(f"{self.model_type} has no engine converter")
        prefix = "examples/models/" if layout == "models" else "examples/"
        return prefix + self.engine.folders[layout]

    def names(self) -> tuple[str, ...]:
        return (self.model_type, *self.aliases, *self.architectures)

    def serves(self, entry: MatrixEntry, caps: TagCapabilities, workflow: str) -> bool:
        """Whether an image of `entry` can serve this model with `workflow`."""
        if workflow not in entry.workflows:
            return False
        if workflow == "engine":
            return (
                self.engine is not None
                and "engine_build" in caps.features
                and Rule(since=self.engine.since).applies(entry)
            )
        return self.llmapi_since is not None and Rule(since=self.llmapi_since).applies(entry)


# --- loading -------------------------------------------------------------------------------------------------------


def load_models(path: Path = MODELS_PATH) -> tuple[ModelSupport, ...]:
    data = read_yaml(path, "models file", "run from a checkout of trtllm-images")
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"models"} or not isinstance(data["models"], list):
        errors.append("top level: expected the single key 'models' with a list of models")
        raise_problems(path, errors, "models.yaml's header comment describes every field")
    models = [_model(raw, i, errors) for i, raw in enumerate(data["models"])]
    seen: dict[str, str] = {}
    for model in filter(None, models):
        for name in model.names():
            if name in seen:
                errors.append(f"model {model.model_type}: {name!r} is already a name of model {seen[name]}")
            seen[name] = model.model_type
    if errors:
        raise_problems(path, errors, "models.yaml's header comment describes every field")
    return tuple(filter(None, models))


def _model(raw: object, index: int, errors: list[str]) -> ModelSupport | None:
    if not isinstance(raw, dict):
        errors.append(f"model #{index}: expected a mapping of fields, got {type(raw).__name__}")
        return None
    name = raw.get("model_type") if isinstance(raw.get("model_type"), str) else f"#{index}"
    before = len(errors)
    where = f"model {name}"
    for key in raw:
        if key not in MODEL_KEYS:
            errors.append(f"{where}: {key}: unknown key; allowed keys: {', '.join(MODEL_KEYS)}")
    for key in MODEL_REQUIRED:
        if key not in raw:
            errors.append(f"{where}: {key}: missing key")
    if len(errors) > before:
        return None
    engine = _engine(raw["engine"], f"{where}: engine", errors)
    llmapi = None
    if raw["llmapi"] is not None:
        llmapi_raw = expect_mapping(raw["llmapi"], f"{where}: llmapi", errors)
        if set(llmapi_raw) != {"since"}:
            errors.append(f"{where}: llmapi: expected null or {{since: VERSION}}")
        llmapi = expect_version(llmapi_raw.get("since"), f"{where}: llmapi.since", errors)
    uncertain = expect_mapping(raw.get("uncertain", {}), f"{where}: uncertain", errors)
    for key, reason in uncertain.items():
        if key not in UNCERTAIN_MODEL_KEYS or not isinstance(reason, str) or not reason.strip():
            errors.append(f"{where}: uncertain.{key}: expected one of {', '.join(UNCERTAIN_MODEL_KEYS)} with a reason")
    model = ModelSupport(
        model_type=raw["model_type"],
        aliases=expect_strings(raw.get("aliases", []), f"{where}: aliases", errors),
        architectures=expect_strings(raw["architectures"], f"{where}: architectures", errors),
        engine=engine,
        llmapi_since=llmapi,
        uncertain=MappingProxyType(dict(uncertain)),
        sources=expect_strings(raw["sources"], f"{where}: sources", errors),
    )
    if engine is None and llmapi is None:
        errors.append(f"{where}: engine and llmapi are both null; list only models some release serves")
    return model if len(errors) == before else None


def _engine(raw: object, where: str, errors: list[str]) -> Engine | None:
    if raw is None:
        return None
    raw = expect_mapping(raw, where, errors)
    for key in raw:
        if key not in ENGINE_KEYS:
            errors.append(f"{where}.{key}: unknown key; allowed keys: {', '.join(ENGINE_KEYS)}")
    since = expect_version(raw.get("since"), f"{where}.since", errors)
    if since is None:
        errors.append(f"{where}.since: missing: the first release with a converter")
    folders = expect_mapping(raw.get("folder"), f"{where}.folder", errors)
    if set(folders) != set(LAYOUTS) or not all(isinstance(v, str) and v and ".." not in v for v in folders.values()):
        errors.append(f"{where}.folder: expected a relative folder for each layout: {', '.join(LAYOUTS)}")
    elif not folders["models"].startswith(("core/", "contrib/")):
        errors.append(f"{where}.folder.models: expected core/<dir> or contrib/<dir>, got {folders['models']!r}")
    args = []
    for i, item in enumerate(raw.get("args", [])):
        item = expect_mapping(item, f"{where}.args[{i}]", errors)
        rule = {k: v for k, v in item.items() if k != "args"}
        args.append(
            ArgsRule(
                expect_strings(item.get("args"), f"{where}.args[{i}].args", errors),
                parse_rule(rule, f"{where}.args[{i}]", errors),
            )
        )
    return Engine(since or "", MappingProxyType(dict(folders)), tuple(args))


# --- what the images carry and what `build.py models` shows --------------------------------------------------------


def image_data(matrix: Matrix) -> tuple[str, str]:
    """(matrix.json, models.json) as an image of this matrix carries them: what build contexts, tests and benchmarks
    write for the entrypoint."""
    capabilities = load_capabilities()
    return image_matrix_json(matrix, capabilities), models_json(load_models(), matrix, capabilities)


def model_record(model: ModelSupport, matrix: Matrix, capabilities: Capabilities) -> dict[str, Any]:
    """One model with the supported tags that serve it per workflow, and the converter arguments per tag."""
    entries = [(entry, capabilities.of(entry)) for entry in matrix.supported()]

    def tags(workflow: str) -> list[str]:
        return [entry.tag for entry, caps in entries if model.serves(entry, caps, workflow)]

    engine = None
    if model.engine is not None:
        engine = {
            "since": model.engine.since,
            "tags": tags("engine"),
            "folder": dict(model.engine.folders),
            "args": [
                {"args": list(a.args), "tags": [e.tag for e, _ in entries if a.rule.applies(e)]}
                for a in model.engine.args
            ],
        }
    llmapi = None if model.llmapi_since is None else {"since": model.llmapi_since, "tags": tags("llmapi")}
    return {
        "model_type": model.model_type,
        "aliases": list(model.aliases),
        "architectures": list(model.architectures),
        "engine": engine,
        "llmapi": llmapi,
        "uncertain": dict(model.uncertain),
        "sources": list(model.sources),
    }


def models_json(models: tuple[ModelSupport, ...], matrix: Matrix, capabilities: Capabilities) -> str:
    """models.json, next to matrix.json in the images: what the entrypoint checks a checkpoint against."""
    return (
        json.dumps(
            {
                "tags": [entry.tag for entry in matrix.supported()],
                "models": [model_record(m, matrix, capabilities) for m in models],
            },
            indent=2,
        )
        + "\n"
    )


def find(models: tuple[ModelSupport, ...], name: str) -> ModelSupport:
    """The model whose model_type, alias or architecture is `name` (case-insensitive)."""
    for model in models:
        if name.lower() in (n.lower() for n in model.names()):
            return model
    raise UsageError(
        f"no model_type or architecture {name!r} in models.yaml",
        "known model types: " + ", ".join(m.model_type for m in models),
    )
