"""LoRA adapters (LORA_DIR): Hugging Face PEFT adapters, one per subdirectory, each read and checked against the base
model before anything is converted. The set of them (names, task ids, and what the engine build, the backend's
prefetch directory and the OpenAI front need) is model/adapter_set.py. Pure, except the readers of an adapter's two
files.

What an adapter directory holds (PEFT's own layout): `adapter_config.json` (`peft_type: LORA`, `r`, `lora_alpha`,
`target_modules`, `base_model_name_or_path`) and `adapter_model.safetensors`, whose tensors are named
`…layers.<i>.(self_attn|mlp).<module>.lora_(A|B).weight`: the names TensorRT-LLM's converter (hf_lora_convert.py)
maps onto its own modules. Anything it would skip or misread is refused here, with one line naming the adapter.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtllm_entrypoint.errors import UsageError

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
VARIABLE = "LORA_DIR"
# The backend loads <prefetch dir>/<task id>/model.lora_{weights,config}.npy and reads each folder name with
# std::stoi (PeftCacheManager::prefetchLoraWeights): task ids are 1 to 2**31 - 1.
TASK_ID_MAX = 2**31 - 1
PREFETCH_FILES = ("model.lora_weights.npy", "model.lora_config.npy")
# Adapter names are what clients send as `model`: the rule SERVED_MODEL_NAME follows.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_HEADER = 100 << 20  # safetensors' own limit on its JSON header
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip
FLOAT_DTYPES = ("F32", "F16", "BF16")
STORAGE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # hf_lora_convert.py --storage-type
# hf_lora_convert.py's module names, by the block they sit in, and TensorRT-LLM's module each becomes.
ATTENTION_MODULES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "qkv_proj": "attn_qkv",
                     "query_key_value": "attn_qkv", "o_proj": "attn_dense", "dense": "attn_dense"}  # fmt: skip
MLP_MODULES = {"gate_proj": "mlp_h_to_4h", "up_proj": "mlp_gate", "down_proj": "mlp_4h_to_h",
               "gate_up_proj": "mlp_h_to_4h", "c_fc": "mlp_h_to_4h", "c_proj": "mlp_4h_to_h"}  # fmt: skip
BLOCKS = {"self_attn": ATTENTION_MODULES, "mlp": MLP_MODULES}
TENSOR = re.compile(r"(?:.+\.)?layers\.(\d+)\.(self_attn|mlp)\.([A-Za-z0-9_]+)\.lora_(A|B)\.weight")


def bad_adapter(name: str, problem: str, hint: str) -> UsageError:
    return UsageError(f"{VARIABLE}: adapter {name!r} {problem}", hint)


FEATURE = "lora_prefetch"  # capabilities.yaml: the backend loads adapters from lora_prefetch_dir


def check_servable(workflow: str, features: Iterable[str], tag: str, first_tag: str | None) -> None:
    """LORA_DIR where adapters cannot be served is refused at start (exit 2), before any download: only the C++
    tensorrt_llm model with lora_prefetch_dir selects an adapter by its task id alone."""
    if workflow == "engine" and FEATURE in set(features):
        return
    first = f"tag {first_tag} or later" if first_tag else "a newer tag"
    if workflow != "engine":
        why = f"WORKFLOW={workflow} takes no per-request adapter"
    else:
        why = f"image {tag}'s backend cannot load adapters at start (lora_prefetch_dir)"
    raise UsageError(
        f"{VARIABLE} cannot be served here: {why}; adapters need WORKFLOW=engine on {first}",
        f"use {first} with WORKFLOW=engine, or unset {VARIABLE}",
    )


# --- the safetensors header --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]


def safetensors_header(path: Path, name: str) -> dict[str, Tensor]:
    """The tensors a .safetensors file declares, once its header is proven sane: a JSON object of at most 100 MB
    whose entries have a known dtype, a shape, and byte ranges that match them and tile the data exactly."""
    hint = "the file is damaged or not safetensors: copy the adapter again (PEFT's save_pretrained writes it)"
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise bad_adapter(name, f"has a corrupt {WEIGHTS}: {size} bytes, shorter than a header", hint)
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER or 8 + length > size:
                raise bad_adapter(
                    name, f"has a corrupt {WEIGHTS}: its header claims {length} bytes of a {size}-byte file", hint
                )
            raw = handle.read(length)
    except OSError as exc:
        raise bad_adapter(
            name, f"cannot be read: {exc.strerror} ({path})", "check the mount and its permissions"
        ) from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise bad_adapter(name, f"has a corrupt {WEIGHTS}: its header is not JSON", hint) from None
    if not isinstance(header, dict):
        raise bad_adapter(name, f"has a corrupt {WEIGHTS}: its header is not a JSON object", hint)
    data_size = size - 8 - length
    tensors: dict[str, Tensor] = {}
    spans: list[tuple[int, int, str]] = []
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise bad_adapter(name, f"has a corrupt {WEIGHTS}: __metadata__ is not a map of strings", hint)
            continue
        problem = _entry_problem(entry)
        if problem:
            raise bad_adapter(name, f"has a corrupt {WEIGHTS}: tensor {key!r} {problem}", hint)
        begin, end = entry["data_offsets"]
        tensors[key] = Tensor(entry["dtype"], tuple(entry["shape"]))
        spans.append((begin, end, key))
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            raise bad_adapter(name, f"has a corrupt {WEIGHTS}: tensor {key!r} overlaps another or leaves a gap", hint)
        position = end
    if position != data_size:
        raise bad_adapter(
            name, f"has a corrupt {WEIGHTS}: its tensors take {position} bytes but the file holds {data_size}", hint
        )
    return tensors


def _entry_problem(entry: object) -> str | None:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        return "is not {dtype, shape, data_offsets}"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BYTES:
        return f"has an unknown dtype {dtype!r}"
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return "has a shape that is not a list of sizes"
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return "has byte offsets that are not [begin, end]"
    if offsets[1] - offsets[0] != math.prod(shape) * DTYPE_BYTES[dtype]:
        return f"takes {offsets[1] - offsets[0]} bytes, not the {math.prod(shape) * DTYPE_BYTES[dtype]} its shape says"
    return None


# --- the base model ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """The base model's sizes an adapter must fit (config.json of a checkpoint, or an engine's pretrained_config)."""

    model_id: str | None  # the hub id it came from, when it did
    layers: int | None
    hidden: int | None
    intermediate: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], model_id: str | None) -> Base:
        text = config.get("text_config")
        c: Mapping[str, Any] = {**config, **text} if isinstance(text, dict) else config

        def number(*keys: str) -> int | None:
            found = next((c[k] for k in keys if isinstance(c.get(k), int) and not isinstance(c.get(k), bool)), None)
            return found if found and found > 0 else None

        hidden, heads = number("hidden_size", "n_embd"), number("num_attention_heads", "n_head")
        head_dim = number("head_dim", "head_size") or (hidden // heads if hidden and heads else None)
        return cls(
            model_id=model_id,
            layers=number("num_hidden_layers", "n_layer"),
            hidden=hidden,
            intermediate=number("intermediate_size", "ffn_hidden_size", "n_inner"),
            heads=heads,
            kv_heads=number("num_key_value_heads") or heads,
            head_dim=head_dim,
        )

    def sizes(self, module: str) -> tuple[int | None, int | None]:
        """(inputs, outputs) of one of the base model's linear layers, where the config says them."""
        h, i = self.hidden, self.intermediate
        q = self.heads * self.head_dim if self.heads and self.head_dim else None
        kv = self.kv_heads * self.head_dim if self.kv_heads and self.head_dim else None
        qkv = q + 2 * kv if q and kv else None
        table = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "qkv_proj": (h, qkv),
                 "query_key_value": (h, qkv), "o_proj": (q, h), "dense": (q, h), "gate_proj": (h, i),
                 "up_proj": (h, i), "c_fc": (h, i), "down_proj": (i, h), "c_proj": (i, h),
                 "gate_up_proj": (h, 2 * i if i else None)}  # fmt: skip
        return table[module]


# --- one adapter -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adapter:
    name: str
    path: Path
    rank: int
    alpha: float
    base_model: str | None  # adapter_config.json's base_model_name_or_path
    modules: frozenset[str]  # hf_lora_convert.py's names (q_proj, …)
    rows: int  # (layer, module) pairs: rows of the converted arrays
    row_elements: int  # the longest row: A's and B's elements of one module
    tensors: Mapping[tuple[int, str], tuple[Tensor, Tensor]] = field(repr=False, compare=False)
    digest: str = ""  # the directory's content digest (model_digest.content_digest)
    task_id: int = 0

    @property
    def target_modules(self) -> frozenset[str]:
        """TensorRT-LLM's names for the modules it changes (trtllm-build --lora_target_modules)."""
        return frozenset({**ATTENTION_MODULES, **MLP_MODULES}[m] for m in self.modules)

    def converted_bytes(self, storage: str) -> int:
        """The size of model.lora_weights.npy's data: every row padded to the longest, in the storage dtype."""
        return self.rows * self.row_elements * STORAGE_BYTES[storage]


def read_adapter(path: Path, name: str, max_rank: int) -> Adapter:
    """One adapter directory, checked on its own: a PEFT LoRA of rank 1 to `max_rank` whose every tensor the
    converter maps onto a TensorRT-LLM module, with A and B shaped by that rank."""
    config = _read_config(path, name)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise bad_adapter(name, f"has r={rank!r} in {CONFIG}", "r is the adapter's rank, a whole number from 1")
    if rank > max_rank:
        raise bad_adapter(
            name, f"has rank {rank}, above LORA_MAX_RANK={max_rank}", f"raise LORA_MAX_RANK to at least {rank}"
        )
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
        raise bad_adapter(name, f"has lora_alpha={alpha!r} in {CONFIG}", "lora_alpha is a number greater than 0")
    tensors = safetensors_header(_weights_path(path, name), name)
    pairs: dict[tuple[int, str], dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        match = TENSOR.fullmatch(key)
        if not match or match.group(3) not in BLOCKS[match.group(2)]:
            raise bad_adapter(
                name,
                f"has tensor {key!r}, which TensorRT-LLM's converter cannot place",
                "only LoRA A/B weights of "
                + ", ".join(f"{b}.{{{','.join(m)}}}" for b, m in BLOCKS.items())
                + " are served (no modules_to_save, biases or DoRA)",
            )
        if tensor.dtype not in FLOAT_DTYPES or len(tensor.shape) != 2:
            raise bad_adapter(name, f"has tensor {key!r} of {tensor.dtype} {list(tensor.shape)}", "2-D F16/BF16/F32")
        pairs.setdefault((int(match.group(1)), match.group(3)), {})[match.group(4)] = tensor
    if not pairs:
        raise bad_adapter(name, f"has no LoRA weights in {WEIGHTS}", "a PEFT LoRA adapter saved by save_pretrained")
    complete: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
    for (layer, module), ab in sorted(pairs.items()):
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            raise bad_adapter(name, f"has layer {layer} {module} without its lora_{'B' if a else 'A'}", "save it again")
        if a.shape[0] != rank or b.shape[1] != rank:
            raise bad_adapter(
                name,
                f"has layer {layer} {module} of rank {a.shape[0]}/{b.shape[1]}, not r={rank} ({CONFIG})",
                "per-module ranks (rank_pattern) are not served: one rank for every module",
            )
        complete[(layer, module)] = (a, b)
    return Adapter(
        name=name,
        path=path,
        rank=rank,
        alpha=float(alpha),
        base_model=config.get("base_model_name_or_path") or None,
        modules=frozenset(module for _, module in complete),
        rows=len(complete),
        row_elements=max(a.shape[0] * a.shape[1] + b.shape[0] * b.shape[1] for a, b in complete.values()),
        tensors=complete,
    )


def _read_config(path: Path, name: str) -> dict[str, Any]:
    file = path / CONFIG
    hint = "each subdirectory of LORA_DIR is one PEFT adapter, as save_pretrained writes it"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad_adapter(name, f"has no {CONFIG}", hint) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise bad_adapter(name, f"has an unreadable {CONFIG}: {exc}", hint) from None
    if not isinstance(config, dict):
        raise bad_adapter(name, f"has a {CONFIG} that is not a JSON object", hint)
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise bad_adapter(name, f"is a {peft_type} adapter", "only LoRA adapters (peft_type LORA) are served")
    unsupported = [
        ("use_dora", "DoRA (use_dora)", config.get("use_dora")),
        ("modules_to_save", "modules_to_save", config.get("modules_to_save")),
        ("rank_pattern", "per-module ranks (rank_pattern)", config.get("rank_pattern")),
        ("alpha_pattern", "per-module alphas (alpha_pattern)", config.get("alpha_pattern")),
    ]
    for _key, what, value in unsupported:
        if value:
            raise bad_adapter(
                name, f"uses {what}", "TensorRT-LLM serves plain LoRA: one rank and alpha, no saved modules"
            )
    return config


def _weights_path(path: Path, name: str) -> Path:
    weights = path / WEIGHTS
    if weights.is_file():
        return weights
    if (path / "adapter_model.bin").exists():
        raise bad_adapter(
            name,
            "has adapter_model.bin (a pickle, which can run code when loaded) and no adapter_model.safetensors",
            "save it with safe_serialization=True (PEFT's default), or convert it to safetensors",
        )
    raise bad_adapter(name, f"has no {WEIGHTS}", "save it with PEFT's save_pretrained")


def check_fits(adapter: Adapter, base: Base) -> None:
    """An adapter trained on another base model is refused: its layers, or its A/B sizes, do not fit this one."""
    hint = f"serve it with the base model it was trained on ({adapter.base_model or 'see its adapter_config.json'})"
    if (
        base.model_id
        and adapter.base_model
        and _is_hub_id(adapter.base_model)
        and adapter.base_model.lower() != base.model_id.lower()
    ):
        raise bad_adapter(
            adapter.name, f"is for base model {adapter.base_model!r}, not {base.model_id!r} (MODEL_ID)", hint
        )
    for (layer, module), (a, b) in sorted(adapter.tensors.items()):
        if base.layers is not None and layer >= base.layers:
            raise bad_adapter(
                adapter.name, f"changes layer {layer}; the base model has {base.layers} layers: another base", hint
            )
        inputs, outputs = base.sizes(module)
        if (inputs and a.shape[1] != inputs) or (outputs and b.shape[0] != outputs):
            raise bad_adapter(
                adapter.name,
                f"is for another base model: its layer {layer} {module} maps {a.shape[1]} -> {b.shape[0]}, "
                f"the base model's {inputs} -> {outputs}",
                hint,
            )


def _is_hub_id(text: str) -> bool:
    return text.count("/") == 1 and not text.startswith((".", "/")) and not os.path.isabs(text)
