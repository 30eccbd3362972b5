"""Load and validate capabilities.yaml: the rules that name what each release offers, and each matrix entry's named
capabilities (`matrix.json` as the images carry it).

Besides matrix.py, this is the only host module that compares versions: everything else (and the container side,
through the JSON files the images carry) asks for capabilities by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.versions import version_tuple
from trtllm_images.datafile import ROOT, TAG_RE, expect_mapping, expect_version, raise_problems, read_yaml

CAPABILITIES_PATH = ROOT / "capabilities.yaml"
LAYOUTS = ("flat", "models")
PROGRAMS = ("trtllm-build", "convert_checkpoint", "quantize", "openai_frontend")
RULE_KEYS = ("since", "until", "since_tag")
FEATURE_KEYS = (*RULE_KEYS, "why", "source", "uncertain")


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


def load_capabilities(path: Path = CAPABILITIES_PATH) -> Capabilities:
    data = read_yaml(path, "capabilities file", "run from a checkout of trtllm-images")
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"features", "examples_layout", "flags"}:
        errors.append("top level: expected the keys features, examples_layout, flags")
        raise_problems(path, errors, "capabilities.yaml's header comment describes every field")
    features = {
        name: parse_rule(raw, f"features.{name}", errors, FEATURE_KEYS)
        for name, raw in expect_mapping(data["features"], "features", errors).items()
    }
    layouts = {
        name: parse_rule(raw, f"examples_layout.{name}", errors)
        for name, raw in expect_mapping(data["examples_layout"], "examples_layout", errors).items()
    }
    for name in set(layouts) ^ set(LAYOUTS):
        errors.append(f"examples_layout.{name}: expected exactly the layouts {', '.join(LAYOUTS)}")
    flags: dict[str, dict[str, Rule]] = {}
    for program, raw in expect_mapping(data["flags"], "flags", errors).items():
        if program not in PROGRAMS:
            errors.append(f"flags.{program}: unknown program; allowed: {', '.join(PROGRAMS)}")
        flags[program] = {}
        for flag, rule in expect_mapping(raw, f"flags.{program}", errors).items():
            if not str(flag).startswith("--"):
                errors.append(f"flags.{program}.{flag}: a flag starts with --")
            flags[program][flag] = parse_rule(rule, f"flags.{program}.{flag}", errors)
    if errors:
        raise_problems(path, errors, "capabilities.yaml's header comment describes every field")
    return Capabilities(
        MappingProxyType(features),
        MappingProxyType(layouts),
        MappingProxyType({p: MappingProxyType(f) for p, f in flags.items()}),
    )


def parse_rule(raw: object, where: str, errors: list[str], allowed: tuple[str, ...] = RULE_KEYS) -> Rule:
    raw = expect_mapping(raw, where, errors)
    for key in raw:
        if key not in allowed:
            errors.append(f"{where}.{key}: unknown key; allowed keys: {', '.join(allowed)}")
    return Rule(
        since=expect_version(raw.get("since"), f"{where}.since", errors),
        until=expect_version(raw.get("until"), f"{where}.until", errors),
        since_tag=expect_version(raw.get("since_tag"), f"{where}.since_tag", errors, TAG_RE, "25.01"),
    )
