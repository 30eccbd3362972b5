"""Load and validate capabilities.yaml and models.yaml; name each tag's capabilities and the tags that serve a model.

Besides matrix.py, this is the only host module that compares versions: everything else (and the container side,
through the JSON files the images carry) asks for capabilities by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.versions import version_tuple
from trtllm_images.datafile import TAG_RE, VERSION_RE, read_yaml

if TYPE_CHECKING:
    from trtllm_images.matrix import Matrix, MatrixEntry

ROOT = Path(__file__).resolve().parents[1]
CAPABILITIES_PATH = ROOT / "capabilities.yaml"
MODELS_PATH = ROOT / "models.yaml"
LAYOUTS = ("flat", "models")
PROGRAMS = ("trtllm-build", "convert_checkpoint", "quantize", "openai_frontend")
RULE_KEYS = ("since", "until", "since_tag")
FEATURE_KEYS = (*RULE_KEYS, "why", "source", "uncertain")
MODEL_KEYS = ("model_type", "aliases", "architectures", "engine", "llmapi", "uncertain", "sources")
MODEL_REQUIRED = ("model_type", "architectures", "engine", "llmapi", "sources")
ENGINE_KEYS = ("since", "folder", "args")
UNCERTAIN_MODEL_KEYS = ("engine", "engine.args", "llmapi")


class Release(Protocol):
    """What a rule compares: an NGC tag and its TensorRT-LLM version (a matrix entry, also while it is loaded)."""

    @property
    def tag(self) -> str: ...

    @property
    def tensorrt_llm(self) -> str | None: ...


@dataclass(frozen=True)
class Rule:
    """since <= TensorRT-LLM version < until; since_tag <= NGC tag. No bound: every release."""

    since: str | None = None
    until: str | None = None
    since_tag: str | None = None

    def applies(self, entry: Release) -> bool:
        if self.since_tag is not None and version_tuple(entry.tag) < version_tuple(self.since_tag):
            return False
        if self.since is None and self.until is None:
            return True
        if not entry.tensorrt_llm:
            return False
        release = version_tuple(entry.tensorrt_llm)
        return (self.since is None or release >= version_tuple(self.since)) and (
            self.until is None or release < version_tuple(self.until)
        )


@dataclass(frozen=True)
class TagCapabilities:
    """What one image offers, by name: the JSON object under `capabilities` in each matrix.json entry."""

    examples_layout: str
    features: tuple[str, ...]
    flags: Mapping[str, tuple[str, ...]] = field(hash=False)

    def to_dict(self) -> dict:
        return {
            "examples_layout": self.examples_layout,
            "features": list(self.features),
            "flags": {program: list(flags) for program, flags in self.flags.items()},
        }


@dataclass(frozen=True)
class Capabilities:
    features: Mapping[str, Rule] = field(hash=False)
    layouts: Mapping[str, Rule] = field(hash=False)
    flags: Mapping[str, Mapping[str, Rule]] = field(hash=False)

    def features_of(self, entry: Release) -> tuple[str, ...]:
        return tuple(name for name, rule in self.features.items() if rule.applies(entry))

    def of(self, entry: Release) -> TagCapabilities:
        layouts = [name for name, rule in self.layouts.items() if rule.applies(entry)]
        if len(layouts) != 1:
            raise UsageError(
                f"capabilities.yaml: examples_layout gives {layouts or 'no layout'} for tag {entry.tag} "
                f"(TensorRT-LLM {entry.tensorrt_llm})",
                "exactly one layout rule must apply to a tag",
            )
        return TagCapabilities(
            examples_layout=layouts[0],
            features=self.features_of(entry),
            flags=MappingProxyType(
                {
                    program: tuple(flag for flag, rule in flags.items() if rule.applies(entry))
                    for program, flags in self.flags.items()
                }
            ),
        )


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


def load_capabilities(path: Path = CAPABILITIES_PATH) -> Capabilities:
    data = read_yaml(path, "capabilities file", "run from a checkout of trtllm-images")
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"features", "examples_layout", "flags"}:
        errors.append("top level: expected the keys features, examples_layout, flags")
        _raise(path, errors, "capabilities.yaml's header comment describes every field")
    features = {
        name: _rule(raw, f"features.{name}", errors, FEATURE_KEYS)
        for name, raw in _mapping(data["features"], "features", errors).items()
    }
    layouts = {
        name: _rule(raw, f"examples_layout.{name}", errors)
        for name, raw in _mapping(data["examples_layout"], "examples_layout", errors).items()
    }
    for name in set(layouts) ^ set(LAYOUTS):
        errors.append(f"examples_layout.{name}: expected exactly the layouts {', '.join(LAYOUTS)}")
    flags: dict[str, dict[str, Rule]] = {}
    for program, raw in _mapping(data["flags"], "flags", errors).items():
        if program not in PROGRAMS:
            errors.append(f"flags.{program}: unknown program; allowed: {', '.join(PROGRAMS)}")
        flags[program] = {}
        for flag, rule in _mapping(raw, f"flags.{program}", errors).items():
            if not str(flag).startswith("--"):
                errors.append(f"flags.{program}.{flag}: a flag starts with --")
            flags[program][flag] = _rule(rule, f"flags.{program}.{flag}", errors)
    if errors:
        _raise(path, errors, "capabilities.yaml's header comment describes every field")
    return Capabilities(
        MappingProxyType(features),
        MappingProxyType(layouts),
        MappingProxyType({p: MappingProxyType(f) for p, f in flags.items()}),
    )


def load_models(path: Path = MODELS_PATH) -> tuple[ModelSupport, ...]:
    data = read_yaml(path, "models file", "run from a checkout of trtllm-images")
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"models"} or not isinstance(data["models"], list):
        errors.append("top level: expected the single key 'models' with a list of models")
        _raise(path, errors, "models.yaml's header comment describes every field")
    models = [_model(raw, i, errors) for i, raw in enumerate(data["models"])]
    seen: dict[str, str] = {}
    for model in filter(None, models):
        for name in model.names():
            if name in seen:
                errors.append(f"model {model.model_type}: {name!r} is already a name of model {seen[name]}")
            seen[name] = model.model_type
    if errors:
        _raise(path, errors, "models.yaml's header comment describes every field")
    return tuple(filter(None, models))


def _raise(path: Path, errors: list[str], hint: str) -> NoReturn:
    count = f"{len(errors)} problem" + ("s" if len(errors) != 1 else "")
    raise UsageError(f"{path}: {count}:\n" + "\n".join(f"  - {e}" for e in errors), hint)


def _mapping(raw: object, where: str, errors: list[str]) -> dict:
    if isinstance(raw, dict):
        return raw
    errors.append(f"{where}: expected a mapping, got {type(raw).__name__}")
    return {}


def _version(raw: object, where: str, errors: list[str], pattern=VERSION_RE, example: str = "0.20.0") -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str) and pattern.match(raw):
        return raw
    errors.append(f'{where}: expected a quoted version such as "{example}", got {raw!r}')
    return None


def _rule(raw: object, where: str, errors: list[str], allowed: tuple[str, ...] = RULE_KEYS) -> Rule:
    raw = _mapping(raw, where, errors)
    for key in raw:
        if key not in allowed:
            errors.append(f"{where}.{key}: unknown key; allowed keys: {', '.join(allowed)}")
    return Rule(
        since=_version(raw.get("since"), f"{where}.since", errors),
        until=_version(raw.get("until"), f"{where}.until", errors),
        since_tag=_version(raw.get("since_tag"), f"{where}.since_tag", errors, TAG_RE, "25.01"),
    )


def _strings(raw: object, where: str, errors: list[str]) -> tuple[str, ...]:
    if isinstance(raw, list) and all(isinstance(item, str) and item for item in raw):
        return tuple(raw)
    errors.append(f"{where}: expected a list of non-empty strings, got {raw!r}")
    return ()


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
        llmapi_raw = _mapping(raw["llmapi"], f"{where}: llmapi", errors)
        if set(llmapi_raw) != {"since"}:
            errors.append(f"{where}: llmapi: expected null or {{since: VERSION}}")
        llmapi = _version(llmapi_raw.get("since"), f"{where}: llmapi.since", errors)
    uncertain = _mapping(raw.get("uncertain", {}), f"{where}: uncertain", errors)
    for key, reason in uncertain.items():
        if key not in UNCERTAIN_MODEL_KEYS or not isinstance(reason, str) or not reason.strip():
            errors.append(f"{where}: uncertain.{key}: expected one of {', '.join(UNCERTAIN_MODEL_KEYS)} with a reason")
    model = ModelSupport(
        model_type=raw["model_type"],
        aliases=_strings(raw.get("aliases", []), f"{where}: aliases", errors),
        architectures=_strings(raw["architectures"], f"{where}: architectures", errors),
        engine=engine,
        llmapi_since=llmapi,
        uncertain=MappingProxyType(dict(uncertain)),
        sources=_strings(raw["sources"], f"{where}: sources", errors),
    )
    if engine is None and llmapi is None:
        errors.append(f"{where}: engine and llmapi are both null; list only models some release serves")
    return model if len(errors) == before else None


def _engine(raw: object, where: str, errors: list[str]) -> Engine | None:
    if raw is None:
        return None
    raw = _mapping(raw, where, errors)
    for key in raw:
        if key not in ENGINE_KEYS:
            errors.append(f"{where}.{key}: unknown key; allowed keys: {', '.join(ENGINE_KEYS)}")
    since = _version(raw.get("since"), f"{where}.since", errors)
    if since is None:
        errors.append(f"{where}.since: missing: the first release with a converter")
    folders = _mapping(raw.get("folder"), f"{where}.folder", errors)
    if set(folders) != set(LAYOUTS) or not all(isinstance(v, str) and v and ".." not in v for v in folders.values()):
        errors.append(f"{where}.folder: expected a relative folder for each layout: {', '.join(LAYOUTS)}")
    elif not folders["models"].startswith(("core/", "contrib/")):
        errors.append(f"{where}.folder.models: expected core/<dir> or contrib/<dir>, got {folders['models']!r}")
    args = []
    for i, item in enumerate(raw.get("args", [])):
        item = _mapping(item, f"{where}.args[{i}]", errors)
        rule = {k: v for k, v in item.items() if k != "args"}
        args.append(
            ArgsRule(
                _strings(item.get("args"), f"{where}.args[{i}].args", errors), _rule(rule, f"{where}.args[{i}]", errors)
            )
        )
    return Engine(since or "", MappingProxyType(dict(folders)), tuple(args))


# --- what the images carry and what `build.py models` shows --------------------------------------------------------


def image_data(matrix: Matrix) -> tuple[str, str]:
    """(matrix.json, models.json) as an image of this matrix carries them: what build contexts, tests and benchmarks
    write for the entrypoint."""
    capabilities = load_capabilities()
    return image_matrix_json(matrix, capabilities), models_json(load_models(), matrix, capabilities)


def image_matrix_json(matrix: Matrix, capabilities: Capabilities) -> str:
    """matrix.json as the images carry it: every entry with its named capabilities. Deterministic (image layers)."""
    entries = [{**entry.to_dict(), "capabilities": capabilities.of(entry).to_dict()} for entry in matrix.entries]
    return json.dumps(entries, indent=2) + "\n"


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
