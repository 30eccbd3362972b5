"""What a built engine's `config.json` says (written by trtllm-build: `version`, `pretrained_config`,
`build_config`): the ranks it needs, the TensorRT-LLM that built it, and the serving limits it was built with."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from trtllm_entrypoint.config.records import Limits, Parallelism
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.model import files as model_files
from trtllm_entrypoint.versions import version_tuple

ENGINE_CONFIG = "config.json"
# trtllm-build records the limits in build_config and the parallelism in pretrained_config.mapping under the names
# of the EngineSpec fields (and variables) that set them, so they are read back by those names.
LIMITS = tuple(f.name for f in fields(Limits))
PARALLELISM = tuple(f.name for f in fields(Parallelism))
MAX_WORLD_SIZE = 4096  # ranks; far above any node group, and a bound on the rank files looked for


def _read_engine_config(engine_dir: Path) -> dict[str, Any]:
    path = engine_dir / ENGINE_CONFIG
    config = model_files.read_json_object(path)
    if config is None:
        raise EntrypointError(
            f"{path} does not exist",
            "an engine directory holds config.json and rank*.engine as written by trtllm-build",
        )
    return config


def _section(engine_dir: Path, config: dict[str, Any], *keys: str) -> dict[str, Any]:
    """config[keys[0]][keys[1]]…, {} where absent; UsageError where it is not a JSON object."""
    for depth, key in enumerate(keys):
        value = config.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            where = ".".join(keys[: depth + 1])
            raise UsageError(f"{engine_dir / ENGINE_CONFIG} is not allowed: expected {where} to be a JSON object")
        config = value
    return config


class BuiltEngine:
    """One engine directory's config.json, read once (`read`): every fact the serve path needs comes from here.

    Each fact is checked when first asked for, so a check that fails reports what the start needed first."""

    def __init__(self, path: Path, config: dict[str, Any]):
        self.path = path
        self.config = config

    @functools.cached_property
    def _mapping(self) -> dict[str, Any]:
        return _section(self.path, self.config, "pretrained_config", "mapping")

    @functools.cached_property
    def world_size(self) -> int:
        """Ranks the engine was built for (one rank*.engine each): mapping.world_size, else tp*pp, else 1."""
        mapping = self._mapping
        world_size = mapping.get("world_size", None)
        if world_size is None:
            world_size = mapping.get("tp_size", 1), mapping.get("pp_size", 1)
            valid = all(type(n) is int for n in world_size)
            world_size = world_size[0] * world_size[1] if valid else None
        if type(world_size) is not int or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise UsageError(
                f"{self.path / ENGINE_CONFIG} is not allowed: expected pretrained_config.mapping to give a world "
                f"size from 1 to {MAX_WORLD_SIZE}, got {json.dumps(mapping)[:120]}"
            )
        return world_size

    @property
    def version(self) -> object:
        """The TensorRT-LLM that built it (None: the legacy per-model build scripts, which record none)."""
        return self.config.get("version")

    @functools.cached_property
    def limits(self) -> dict[str, int]:
        """The serving limits in build_config; engines before TensorRT-LLM 0.11 record max_output_len instead of
        max_seq_len, which is then their sum with max_input_len."""
        build = _section(self.path, self.config, "build_config")
        numbers = {k: v for k, v in build.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
        limits = {name: numbers[name] for name in LIMITS if name in numbers}
        if "max_seq_len" not in limits and {"max_input_len", "max_output_len"} <= set(numbers):
            limits["max_seq_len"] = numbers["max_input_len"] + numbers["max_output_len"]
        return limits

    @functools.cached_property
    def parallelism(self) -> dict[str, int]:
        mapping = self._mapping
        return {
            name: mapping[name]
            for name in PARALLELISM
            if isinstance(mapping.get(name), int) and not isinstance(mapping[name], bool)
        }

    def missing_ranks(self) -> list[str]:
        return [
            f"rank{rank}.engine" for rank in range(self.world_size) if not (self.path / f"rank{rank}.engine").is_file()
        ]


def read(engine_dir: Path) -> BuiltEngine:
    """The engine's config.json, read once."""
    return BuiltEngine(engine_dir, _read_engine_config(engine_dir))


def check_engine_version(engine: BuiltEngine, installed: str) -> None:
    """Engines only load with the exact TensorRT-LLM version that built them."""
    built_with = engine.version
    rebuild = (
        "rebuild it with the builder image of this tag, or set MODEL_ID to the model checkpoint "
        "so the engine is built here"
    )
    if built_with is None:
        raise EntrypointError(
            f"the engine in {engine.path} has no version in config.json: it was built by the "
            f"legacy per-model build scripts and cannot run with TensorRT-LLM {installed}",
            rebuild,
        )
    if built_with != installed:
        same_release = version_tuple(str(built_with)) == version_tuple(installed)
        detail = " (same release, different build: engines need the exact version)" if same_release else ""
        raise EntrypointError(
            f"the engine in {engine.path} was built with TensorRT-LLM {built_with}, this image has {installed}{detail}",
            rebuild,
        )


def serving_settings(settings: Settings, engine: BuiltEngine) -> tuple[Settings, dict[str, int]]:
    """The settings with the engine's parallelism and limits where the user set none, and those taken; a value the
    user set that the engine cannot honour (another parallelism, a limit above the engine's) is refused."""
    built = {**engine.parallelism, **engine.limits}
    for name, value in built.items():
        exact = name in PARALLELISM
        asked = getattr(settings, name)
        if name in settings.explicit and (asked != value if exact else asked > value):
            raise UsageError(
                f"{name.upper()}={asked} is not allowed: expected {'' if exact else 'at most '}{value}, "
                f"what the engine in {engine.path} was built for",
                f"unset {name.upper()} to serve the engine's {value}, or rebuild the engine",
            )
    taken = {
        name: value
        for name, value in built.items()
        if name not in settings.explicit and getattr(settings, name) != value
    }
    changes: dict[str, Any] = dict(taken)
    return dataclasses.replace(settings, **changes), taken
