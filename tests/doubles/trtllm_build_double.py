#!/usr/bin/env python3
"""Stand-in for `trtllm-build`: writes an engine directory shaped like TensorRT-LLM's (config.json + rank{i}.engine).

Env: DOUBLE_RECORD_DIR, TRTLLM_DOUBLE_VERSION (when no tensorrt_llm is installed), TRTLLM_BUILD_DOUBLE_SLEEP (seconds,
after creating the output dir and before the engines: lets tests kill a build midway), TRTLLM_BUILD_DOUBLE_FAIL=1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import last, parse_flags, record  # noqa: E402
from help_flags import parse_or_exit  # noqa: E402


def typed(value: str) -> object:
    if value.lstrip("-").isdigit():
        return int(value)
    return value


def nargs(argv: list[str], flag: str) -> list[str]:
    """The words after `flag` up to the next flag (argparse's nargs='+')."""
    if flag not in argv:
        return []
    rest = argv[argv.index(flag) + 1 :]
    return rest[: next((i for i, word in enumerate(rest) if word.startswith("--")), len(rest))]


def world_size(checkpoint_config: dict) -> int:
    mapping = checkpoint_config.get("mapping") or {}
    if "world_size" in mapping:
        return int(mapping["world_size"])
    return int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))


def installed_trtllm_version() -> str:
    try:
        return metadata.version("tensorrt_llm")
    except metadata.PackageNotFoundError:
        return os.environ.get("TRTLLM_DOUBLE_VERSION", "0.0.0")


def main(argv: list[str]) -> int:
    parse_or_exit("trtllm-build", argv)  # --help, and the flags this release's trtllm-build has
    flags = parse_flags(argv)
    record("trtllm-build", argv)
    checkpoint_dir, output_dir = last(flags, "checkpoint_dir"), last(flags, "output_dir")
    if not checkpoint_dir or not output_dir:
        print("trtllm-build: error: --checkpoint_dir and --output_dir are required", file=sys.stderr)
        return 2
    try:
        checkpoint = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"trtllm-build: error: cannot read the checkpoint config: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("TRTLLM_BUILD_DOUBLE_FAIL") == "1":
        print("trtllm-build: error: [TensorRT-LLM][ERROR] build failed (TRTLLM_BUILD_DOUBLE_FAIL)", file=sys.stderr)
        return 1
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    time.sleep(float(os.environ.get("TRTLLM_BUILD_DOUBLE_SLEEP") or 0))
    build_config = {k: typed(v[-1]) for k, v in flags.items() if k and k not in ("checkpoint_dir", "output_dir")}
    if "lora_plugin" in flags:  # where the real build_config keeps them: plugin_config and lora_config
        build_config["plugin_config"] = {"lora_plugin": build_config.pop("lora_plugin")}
        build_config["lora_config"] = {
            "lora_target_modules": nargs(argv, "--lora_target_modules"),
            "max_lora_rank": int(last(flags, "max_lora_rank", "64")),
        }
        build_config.pop("lora_target_modules", None)
        build_config.pop("max_lora_rank", None)
    ranks = world_size(checkpoint)
    for rank in range(ranks):
        (out / f"rank{rank}.engine").write_bytes(b"double-engine rank %d\n" % rank)
    config = {"version": installed_trtllm_version(), "pretrained_config": checkpoint, "build_config": build_config}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    print(f"[TensorRT-LLM] [I] double: built {ranks} engine(s) in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
