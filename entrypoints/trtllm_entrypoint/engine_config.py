"""What a built engine's `config.json` says (written by trtllm-build: `version`, `pretrained_config`,
`build_config`): the ranks it needs, the TensorRT-LLM that built it, and the serving limits it was built with."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.settings import Limits, Parallelism, Settings
from trtllm_entrypoint.versions import version_tuple

ENGINE_CONFIG = "config.json"
# trtllm-build records the limits in build_config and the parallelism in pretrained_config.mapping under the names
# of the EngineSpec fields (and variables) that set them, so they are read back by those names.
LIMITS = tuple(f.name for f in fields(Limits))
PARALLELISM = tuple(f.name for f in fields(Parallelism))


def _read_engine_config(engine_dir: Path) -> dict[str, Any]:
    path = engine_dir / ENGINE_CONFIG
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise EntrypointError(
            f"{path} does not exist",
            "an engine directory holds config.json and rank*.engine as written by trtllm-build",
        ) from None
    except (OSError, ValueError) as exc:
        raise EntrypointError(f"cannot read {path}: {exc}") from None
    if not isinstance(config, dict):
        raise EntrypointError(f"{path} is not a JSON object")
    return config


def _mapping(engine_dir: Path) -> dict[str, Any]:
    return (_read_engine_config(engine_dir).get("pretrained_config") or {}).get("mapping") or {}


def engine_world_size(engine_dir: Path) -> int:
    """Ranks the engine was built for (one rank*.engine each): mapping.world_size, else tp*pp, else 1."""
    mapping = _mapping(engine_dir)
    try:
        if "world_size" in mapping:
            return int(mapping["world_size"])
        return int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
    except (TypeError, ValueError):
        raise EntrypointError(
            f"{engine_dir / ENGINE_CONFIG} has a malformed pretrained_config.mapping: {mapping!r}"
        ) from None


def missing_ranks(engine_dir: Path, world_size: int) -> list[str]:
    return [f"rank{rank}.engine" for rank in range(world_size) if not (engine_dir / f"rank{rank}.engine").is_file()]


def check_engine_version(engine_dir: Path, installed: str) -> None:
    """Engines only load with the exact TensorRT-LLM version that built them."""
    built_with = _read_engine_config(engine_dir).get("version")
    rebuild = (
        "rebuild it with the builder image of this tag, or set MODEL_ID to the model checkpoint "
        "so the engine is built here"
    )
    if built_with is None:
        raise EntrypointError(
            f"the engine in {engine_dir} has no version in config.json: it was built by the "
            f"legacy per-model build scripts and cannot run with TensorRT-LLM {installed}",
            rebuild,
        )
    if built_with != installed:
        same_release = version_tuple(str(built_with)) == version_tuple(installed)
        detail = " (same release, different build: engines need the exact version)" if same_release else ""
        raise EntrypointError(
            f"the engine in {engine_dir} was built with TensorRT-LLM {built_with}, this image has {installed}{detail}",
            rebuild,
        )


def built_limits(engine_dir: Path) -> dict[str, int]:
    """The serving limits in build_config; engines before TensorRT-LLM 0.11 record max_output_len instead of
    max_seq_len, which is then their sum with max_input_len."""
    build = _read_engine_config(engine_dir).get("build_config") or {}
    numbers = {k: v for k, v in build.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    limits = {name: numbers[name] for name in LIMITS if name in numbers}
    if "max_seq_len" not in limits and {"max_input_len", "max_output_len"} <= set(numbers):
        limits["max_seq_len"] = numbers["max_input_len"] + numbers["max_output_len"]
    return limits


def built_parallelism(engine_dir: Path) -> dict[str, int]:
    mapping = _mapping(engine_dir)
    return {
        name: mapping[name]
        for name in PARALLELISM
        if isinstance(mapping.get(name), int) and not isinstance(mapping[name], bool)
    }


def serving_settings(settings: Settings, engine_dir: Path) -> tuple[Settings, dict[str, int]]:
    """The settings with the engine's parallelism and limits where the user set none, and those taken; a value the
    user set that the engine cannot honour (another parallelism, a limit above the engine's) is refused."""
    built = {**built_parallelism(engine_dir), **built_limits(engine_dir)}
    for name, value in built.items():
        exact = name in PARALLELISM
        asked = getattr(settings, name)
        if name in settings.explicit and (asked != value if exact else asked > value):
            raise UsageError(
                f"{name.upper()}={asked} is not allowed: expected {'' if exact else 'at most '}{value}, "
                f"what the engine in {engine_dir} was built for",
                f"unset {name.upper()} to serve the engine's {value}, or rebuild the engine",
            )
    taken = {
        name: value
        for name, value in built.items()
        if name not in settings.explicit and getattr(settings, name) != value
    }
    changes: dict[str, Any] = dict(taken)
    return dataclasses.replace(settings, **changes), taken
