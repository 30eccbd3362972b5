"""The set of LoRA adapters (LORA_DIR): their directories and names, each one's task id, and what the set turns into
for the engine build, the backend's prefetch directory and the OpenAI front, and the check of the converter's output.
Each adapter itself is read and checked against the base in model/adapters.py. Pure, except the directory listing and
the readers of the converter's .npy headers.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model.adapters import (
    NAME,
    PREFETCH_FILES,
    STORAGE_BYTES,
    TASK_ID_MAX,
    VARIABLE,
    Adapter,
    bad_adapter,
)

# --- the set of adapters -----------------------------------------------------------------------------------------


def adapter_dirs(root: Path) -> list[tuple[str, Path]]:
    """(name, directory) of each adapter: every subdirectory not starting with '.', by name. Names are what
    clients send as `model`, so they follow SERVED_MODEL_NAME's rule and differ in more than letter case."""
    try:
        entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    except FileNotFoundError:
        raise UsageError(f"{VARIABLE}={root} does not exist", "mount the adapters' directory there") from None
    except NotADirectoryError:
        raise UsageError(
            f"{VARIABLE}={root} is not a directory", "name a directory with one adapter per subdirectory"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"{VARIABLE}={root} cannot be read: {exc.strerror}", "check the mount and its permissions"
        ) from None
    found = [(p.name, p) for p in entries if p.is_dir()]
    if not found:
        raise UsageError(f"{VARIABLE}={root} holds no adapter", "one subdirectory per adapter, named as clients ask")
    seen: dict[str, str] = {}
    for name, _ in found:
        if not NAME.fullmatch(name):
            raise bad_adapter(
                name,
                "has a name clients cannot send",
                "up to 128 letters, digits, '.', '_', '-', first a letter or digit",
            )
        if name.lower() in seen:
            raise bad_adapter(
                name, f"and {seen[name.lower()]!r} have one name (letter case aside)", "rename one of the two"
            )
        seen[name.lower()] = name
    return found


def check_names(adapters: Sequence[Adapter], taken: Iterable[str]) -> None:
    """No adapter may take the base model's served name or a name of the repository's own models."""
    reserved = {t.lower(): t for t in taken}
    for adapter in adapters:
        if adapter.name.lower() in reserved:
            raise bad_adapter(
                adapter.name,
                f"has the name of {reserved[adapter.name.lower()]!r}, which the server already serves",
                "rename the adapter's directory",
            )


def task_id(name: str, digest: str) -> int:
    """The same on every start and every replica for the same adapter under the same name; another id when its
    content changes (the backend's cache then never serves old weights under it)."""
    value = int.from_bytes(hashlib.sha256(f"{name}\0{digest}".encode()).digest()[:8], "big")
    return value % TASK_ID_MAX + 1


def with_task_ids(adapters: Sequence[Adapter]) -> tuple[Adapter, ...]:
    numbered = tuple(replace(a, task_id=task_id(a.name, a.digest)) for a in adapters)
    seen: dict[int, str] = {}
    for adapter in numbered:
        if adapter.task_id in seen:  # one in two billion per pair: named rather than served wrong
            raise bad_adapter(
                adapter.name,
                f"and {seen[adapter.task_id]!r} drew the same task id {adapter.task_id}",
                "rename one of the two (the id is derived from the name and the content)",
            )
        seen[adapter.task_id] = adapter.name
    return numbered


# --- what the build, the repository and the front get ------------------------------------------------------------


@dataclass(frozen=True)
class LoraBuild:
    """The engine's LoRA flags, derived from the adapters: part of the engine cache key, so adapters of the same
    rank and modules share an engine and adding one rebuilds only when it needs a larger rank or another module."""

    plugin_dtype: str
    target_modules: tuple[str, ...]
    max_rank: int

    def argv(self) -> list[str]:
        return [
            "--lora_plugin",
            self.plugin_dtype,
            "--lora_target_modules",
            *self.target_modules,
            "--max_lora_rank",
            str(self.max_rank),
        ]


def lora_build(adapters: Sequence[Adapter], plugin_dtype: str) -> LoraBuild:
    return LoraBuild(
        plugin_dtype=plugin_dtype,
        target_modules=tuple(sorted(set().union(*(a.target_modules for a in adapters)))),
        max_rank=max(a.rank for a in adapters),
    )


def check_prebuilt(build_config: Mapping[str, Any], needed: LoraBuild, engine_dir: Path) -> None:
    """A prebuilt engine (ENGINE_DIR) serves the adapters only when it was built with the LoRA plugin for their
    modules and at least their rank (its config.json: plugin_config.lora_plugin, lora_config)."""
    plugin = (build_config.get("plugin_config") or {}).get("lora_plugin")
    lora = build_config.get("lora_config") or {}
    modules = set(lora.get("lora_target_modules") or ())
    found = lora.get("max_lora_rank")
    rank: int = found if isinstance(found, int) else 0
    hint = f"rebuild it with {' '.join(needed.argv())}, or unset ENGINE_DIR to have the engine built"
    if not plugin or plugin == "disable":
        raise UsageError(f"ENGINE_DIR={engine_dir} was built without the LoRA plugin: it cannot serve {VARIABLE}", hint)
    missing = sorted(set(needed.target_modules) - modules)
    if missing:
        raise UsageError(
            f"ENGINE_DIR={engine_dir} was built for LoRA on {', '.join(sorted(modules)) or 'no module'}; "
            f"{VARIABLE}'s adapters also change {', '.join(missing)}",
            hint,
        )
    if rank < needed.max_rank:
        raise UsageError(
            f"ENGINE_DIR={engine_dir} was built with --max_lora_rank {rank}; {VARIABLE} holds rank {needed.max_rank}",
            hint,
        )


def storage_dtype(dtype: str, base_config: Mapping[str, Any]) -> str:
    """The converted weights' dtype: the engine's (DTYPE, or the checkpoint's own for `auto`)."""
    if dtype in STORAGE_BYTES:
        return dtype
    found = base_config.get("torch_dtype") or base_config.get("dtype")
    return found if isinstance(found, str) and found in STORAGE_BYTES else "float16"


HOST_CACHE_FLOOR = 1 << 30


def cache_parameters(adapters: Sequence[Adapter], storage: str, prefetch_dir: Path) -> dict[str, str]:
    """The tensorrt_llm model's LoRA parameters: the prefetch directory, adapter sizes of the largest rank, and a
    host cache that holds every adapter twice over (at least 1 GiB), so none is ever evicted: an evicted adapter
    could not come back, since requests carry only its task id."""
    largest = max(a.rank for a in adapters)
    total = sum(a.converted_bytes(storage) for a in adapters)
    return {
        "lora_prefetch_dir": str(prefetch_dir),
        "lora_cache_max_adapter_size": str(largest),
        "lora_cache_optimal_adapter_size": str(largest),
        "lora_cache_host_memory_bytes": str(max(HOST_CACHE_FLOOR, 2 * total)),
    }


def convert_argv(python: str, script: Path, adapter: Adapter, out_dir: Path, storage: str) -> tuple[str, ...]:
    """TensorRT-LLM's examples/hf_lora_convert.py for one adapter, into its task id's folder."""
    return (
        python,
        str(script),
        "--in-file",
        str(adapter.path),
        "--out-dir",
        str(out_dir / str(adapter.task_id)),
        "--storage-type",
        storage,
    )


def set_key(adapters: Sequence[Adapter], storage: str, tensorrt_llm: str) -> str:
    """The prefetch directory's cache key: every adapter's name, content and task id, the storage dtype and the
    converter's release."""
    inputs = {
        "schema": 1,
        "adapters": sorted([a.name, a.digest, a.task_id] for a in adapters),
        "storage": storage,
        "tensorrt_llm": tensorrt_llm,
    }
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def served_adapters(adapters: Sequence[Adapter]) -> dict[str, int]:
    """What the front needs: adapter name -> task id."""
    return {a.name: a.task_id for a in adapters}


# --- the converter's output --------------------------------------------------------------------------------------

NPY_MAGIC = b"\x93NUMPY"


def npy_header(path: Path) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of a NumPy .npy file, read from its header with the standard library (versions 1 to 3)."""
    with open(path, "rb") as handle:
        head = handle.read(10)
        if len(head) < 10 or not head.startswith(NPY_MAGIC) or head[6] not in (1, 2, 3):
            raise ValueError(f"{path.name} is not a .npy file")
        if head[6] == 1:
            (length,) = struct.unpack("<H", head[8:10])
        else:
            (length,) = struct.unpack("<I", head[8:10] + handle.read(2))
        text = handle.read(length).decode("latin1")
    descr = re.search(r"'descr':\s*'([^']+)'", text)
    shape = re.search(r"'shape':\s*\(([^)]*)\)", text)
    if descr is None or shape is None:
        raise ValueError(f"{path.name} has no dtype or shape in its header")
    return descr.group(1), tuple(int(d) for d in shape.group(1).replace(",", " ").split())


def layout_problem(folder: Path, adapter: Adapter) -> str | None:
    """Why one task folder is not what the backend loads for `adapter`, or None: exactly the two files, the config
    int32 [1, rows, 3] and the weights [1, rows, width] with one row per (layer, module) of the adapter."""
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if present != sorted(PREFETCH_FILES):
        return f"{folder} holds {present or 'nothing'}, not {', '.join(PREFETCH_FILES)}"
    try:
        weights, config = (npy_header(folder / name) for name in PREFETCH_FILES)
    except (OSError, ValueError) as exc:
        return str(exc)
    if config[0] != "<i4" or len(config[1]) != 3 or config[1][0] != 1 or config[1][2] != 3:
        return f"{folder.name}/model.lora_config.npy is {config[0]} {list(config[1])}, not int32 [1, rows, 3]"
    if len(weights[1]) != 3 or weights[1][:2] != (1, adapter.rows) or config[1][1] != adapter.rows:
        return (
            f"{folder.name}: {weights[1]} weights and {config[1]} config rows for an adapter of {adapter.rows} "
            "(layer, module) pairs: the converter dropped some"
        )
    return None
