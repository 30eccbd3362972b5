#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM's `examples/<family>/convert_checkpoint.py`: HF checkpoint in, TensorRT-LLM checkpoint
out (config.json with architecture, dtype and mapping, plus one rank{i}.safetensors placeholder per rank)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import last, parse_flags, record  # noqa: E402
from help_flags import parse_or_exit  # noqa: E402


def write_checkpoint(program: str, argv: list[str], extra_config: dict | None = None) -> int:
    """Shared by the convert and quantize doubles: both turn --model_dir into a checkpoint in --output_dir."""
    flags = parse_flags(argv)
    record(program, argv)
    model_dir, output_dir = last(flags, "model_dir"), last(flags, "output_dir")
    if not model_dir or not output_dir:
        print(f"{program}: error: --model_dir and --output_dir are required", file=sys.stderr)
        return 2
    try:
        hf_config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"{program}: error: cannot read {model_dir}/config.json: {exc}", file=sys.stderr)
        return 1
    tp_size, pp_size = int(last(flags, "tp_size", "1")), int(last(flags, "pp_size", "1"))
    config = {
        "architecture": (hf_config.get("architectures") or ["UnknownForCausalLM"])[0],
        "dtype": last(flags, "dtype", "auto"),
        "mapping": {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size},
        **(extra_config or {}),
    }
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(tp_size * pp_size):
        (out / f"rank{rank}.safetensors").write_bytes(b"double-checkpoint\n")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return 0


if __name__ == "__main__":
    # Which examples/<folder>/ this wrapper stands in: the path Python was started with (runpy replaces argv[0]).
    parse_or_exit("convert_checkpoint", sys.argv[1:], folder=Path(sys.orig_argv[1]).parent.name)
    sys.exit(write_checkpoint("convert_checkpoint", sys.argv[1:]))
