#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM's `examples/hf_lora_convert.py`: a Hugging Face PEFT adapter in (--in-file, a directory
with adapter_config.json and adapter_model.safetensors), the two arrays the backend's LoRA cache loads out
(--out-dir/model.lora_weights.npy and model.lora_config.npy).

Like the real converter where the backend can tell: one config row [module id, layer, rank] per (layer, module)
found in the adapter, int32 of shape [1, rows, 3]; weights of shape [1, rows, longest row] in --storage-type, each row
the flattened A and B of that module. Unlike it: the weights are zeros (no torch here), and rows come in the
safetensors header's order. Records its argv (DOUBLE_RECORD_DIR). Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import last, parse_flags, record  # noqa: E402
from help_flags import parse_or_exit  # noqa: E402

# The converter's module names and TensorRT-LLM's module ids (LoraManager.LORA_MODULE_IDS).
MODULE_IDS = {
    "q_proj": 1, "k_proj": 2, "v_proj": 3, "qkv_proj": 0, "query_key_value": 0, "o_proj": 4, "dense": 4,
    "gate_proj": 5, "gate_up_proj": 5, "c_fc": 5, "down_proj": 6, "c_proj": 6, "up_proj": 7,
}  # fmt: skip
KEY = re.compile(r".*\.layers\.([0-9]+)\.(self_attn|mlp)\.([a-z_]+)\.lora_(A|B)\.weight.*")
NPY_TYPES = {"float16": ("<f2", 2), "float32": ("<f4", 4), "bfloat16": ("|V2", 2)}


def npy(path: Path, descr: str, shape: tuple[int, ...], data: bytes) -> None:
    """NumPy's .npy format, version 1.0."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data)


def header(path: Path) -> dict:
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(size))


def main(argv: list[str]) -> int:
    parse_or_exit("hf_lora_convert", argv)
    flags = parse_flags(argv)
    record("hf_lora_convert", argv)
    in_dir, out_dir = last(flags, "in-file"), last(flags, "out-dir")
    storage = last(flags, "storage-type", "float16")
    if not in_dir or not out_dir or storage not in NPY_TYPES:
        print("hf_lora_convert.py: error: --in-file and --out-dir are required", file=sys.stderr)
        return 2
    config = json.loads((Path(in_dir) / "adapter_config.json").read_text())
    tensors = header(Path(in_dir) / "adapter_model.safetensors")
    rows: dict[tuple[int, str], dict[str, list[int]]] = {}
    for name, info in tensors.items():
        match = KEY.match(name)
        if name == "__metadata__":
            continue
        if not match:
            print(f"no match {name}")
            continue
        rows.setdefault((int(match.group(1)), match.group(3)), {})[match.group(4)] = info["shape"]
    descr, size = NPY_TYPES[storage]
    lengths = [a[0] * a[1] + b[0] * b[1] for a, b in ((r["A"], r["B"]) for r in rows.values())]
    width = max(lengths, default=0)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    npy(out / "model.lora_weights.npy", descr, (1, len(rows), width), bytes(len(rows) * width * size))
    table = [(MODULE_IDS[module], layer, int(config["r"])) for layer, module in rows]
    data = b"".join(struct.pack("<3i", *row) for row in table)
    npy(out / "model.lora_config.npy", "<i4", (1, len(rows), 3), data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
