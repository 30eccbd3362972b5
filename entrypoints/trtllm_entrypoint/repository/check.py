"""Checking a filled model repository before it is served: no required placeholder left, every config parses
(with Triton's own ModelConfig message: from the images' private validation kit, or an installed tritonclient), and
every ensemble is wired."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.repository import pbtxt
from trtllm_entrypoint.repository.fill import structural_placeholders

if TYPE_CHECKING:
    from trtllm_entrypoint.log import Log


def _load_configs(root: Path) -> dict[str, tuple[Path, str, dict[str, Any]]]:
    configs: dict[str, tuple[Path, str, dict[str, Any]]] = {}
    for path in sorted(root.glob("*/config.pbtxt")):
        text = path.read_text()
        stuck = structural_placeholders(text)
        if stuck:
            raise EntrypointError(
                f"{path}: unfilled required placeholder(s) {', '.join(sorted(stuck))}",
                "fill them (see the backend's docs/model_config.md) before serving",
            )
        parsed = pbtxt.parse(text, str(path))
        if parsed.get("name", path.parent.name) != path.parent.name:
            raise EntrypointError(
                f"{path}: name {parsed.get('name')!r} differs from its directory {path.parent.name!r}",
                "Triton requires them to match",
            )
        configs[path.parent.name] = (path, text, parsed)
    if not configs:
        raise EntrypointError(f"{root} holds no model (no */config.pbtxt)")
    return configs


def _load_file(name: str, path: Path) -> Any:
    module = sys.modules.get(name)
    if module is None:
        found = importlib.util.spec_from_file_location(name, path)
        if found is None or found.loader is None:
            return None
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        sys.modules[name] = module
    return module


def _kit_model_config(kit: Path) -> Any:
    """ModelConfig from the image's private validation kit (protobuf's pure-Python runtime and Triton's generated
    model_config_pb2.py, vendor.lock.json), or None where there is none.

    `google` is bound to the kit's directory alone, so the base image's own protobuf is never imported, whatever its
    version; a process that already imported protobuf (tests) keeps the one it has."""
    pb2 = kit / "model_config_pb2.py"
    if not pb2.is_file() or not (kit / "google" / "protobuf").is_dir():
        return None
    if "google.protobuf" not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec("google", [str(kit)])
        if spec is None:
            return None
        sys.modules["google"] = importlib.util.module_from_spec(spec)
    return getattr(_load_file("trtllm_entrypoint_model_config_pb2", pb2), "ModelConfig", None)


def _tritonclient_model_config() -> Any:
    """Triton's ModelConfig message from an installed tritonclient (outside the images: tests, a developer's venv).

    Loaded from its file: importing `tritonclient.grpc` would import grpc too, which costs more than the check."""
    try:
        spec = importlib.util.find_spec("tritonclient")
        protobuf = importlib.util.find_spec("google.protobuf")
    except (ImportError, ValueError):
        return None
    if spec is None or protobuf is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "grpc" / "model_config_pb2.py"
    if not path.is_file():
        return None
    return getattr(_load_file("tritonclient.grpc.model_config_pb2", path), "ModelConfig", None)


def _model_config_class(kit: Path) -> tuple[Any, str]:
    """(ModelConfig or None, why none)."""
    try:
        found = _kit_model_config(kit) or _tritonclient_model_config()
    except Exception as exc:  # noqa: BLE001  (a broken kit must not stop a start: the check is skipped, loudly)
        return None, f"Triton's ModelConfig message cannot be loaded from {kit}: {type(exc).__name__}: {exc}"
    if found is None:
        return None, f"neither {kit} (the images' validation kit) nor tritonclient is present"
    return found, ""


def _check_protobuf(configs: Mapping[str, tuple[Path, str, dict[str, Any]]], log: Log | None, kit: Path) -> None:
    model_config, why = _model_config_class(kit)
    if model_config is None:
        if log is not None:
            log.warn(f"protobuf check skipped: {why}; configs are checked by the entrypoint's own parser only")
        return
    from google.protobuf import text_format

    for path, text, _ in configs.values():
        try:
            text_format.Parse(text, model_config())
        except text_format.ParseError as exc:
            raise EntrypointError(f"{path}: not a valid Triton ModelConfig: {exc}") from None


def _check_ensemble(name: str, parsed: dict[str, Any], configs: Mapping[str, tuple[Path, str, dict[str, Any]]]) -> None:
    used_inputs: set[str] = set()
    produced: set[str] = set()
    for step in parsed.get("ensemble_scheduling", {}).get("step", []):
        model = step.get("model_name")
        if model not in configs:
            raise EntrypointError(f"ensemble {name!r} has a step for model {model!r}, which is not in the repository")
        step_config = configs[model][2]
        for kind, tensors, declared in (
            ("input", step.get("input_map"), step_config.get("input")),
            ("output", step.get("output_map"), step_config.get("output")),
        ):
            mapping = pbtxt.map_entries(tensors)
            wrong = set(mapping) - set(pbtxt.names(declared))
            if wrong:
                raise EntrypointError(
                    f"ensemble {name!r} maps {kind}(s) {', '.join(sorted(wrong))} of model "
                    f"{model!r}, which declares no such {kind}"
                )
            (used_inputs if kind == "input" else produced).update(mapping.values())
    unused = set(pbtxt.names(parsed.get("input"))) - used_inputs
    unproduced = set(pbtxt.names(parsed.get("output"))) - produced
    if unused or unproduced:
        raise EntrypointError(
            f"ensemble {name!r} wiring is incomplete: inputs never used "
            f"{sorted(unused)}, outputs never produced {sorted(unproduced)}"
        )


def validate_repository(root: Path, log: Log | None = None, kit: Path = Path(contract.VALIDATION_DIR)) -> None:
    """No required placeholder left, every config parses (with Triton's ModelConfig where the image's kit or
    tritonclient has it), ensembles are wired."""
    configs = _load_configs(Path(root))
    _check_protobuf(configs, log, kit)
    for name, (_, _, parsed) in configs.items():
        if parsed.get("platform") == "ensemble":
            _check_ensemble(name, parsed, configs)
