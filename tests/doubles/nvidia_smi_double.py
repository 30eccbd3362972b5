#!/usr/bin/env python3
"""Stand-in for `nvidia-smi`, printing what a real driver prints (see the project's GPU detection notes).

Env: NVIDIA_SMI_DOUBLE_GPUS = ';'-separated `name|compute_cap|memory MiB` (default one H100), or `none` for a machine
without GPUs (prints "No devices were found", exit 6 like the real tool); NVIDIA_SMI_DOUBLE_DRIVER (driver version).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import parse_flags, record  # noqa: E402

DEFAULT_GPUS = "NVIDIA H100 80GB HBM3|9.0|81559"
DEFAULT_DRIVER = "570.124.06"


def gpus_from_env(environ: dict[str, str]) -> list[dict[str, str]]:
    spec = environ.get("NVIDIA_SMI_DOUBLE_GPUS") or DEFAULT_GPUS
    if spec.strip().lower() == "none":
        return []
    driver = environ.get("NVIDIA_SMI_DOUBLE_DRIVER") or DEFAULT_DRIVER
    gpus = []
    for index, item in enumerate(s for s in spec.split(";") if s.strip()):
        name, compute_cap, memory = (part.strip() for part in item.split("|"))
        gpus.append(
            {
                "index": str(index),
                "name": name,
                "compute_cap": compute_cap,
                "memory.total": f"{memory} MiB",
                "driver_version": driver,
                "uuid": f"GPU-00000000-0000-0000-0000-{index:012d}",
            }
        )
    return gpus


def query(gpus: list[dict[str, str]], fields: list[str], nounits: bool) -> list[str]:
    lines = []
    for gpu in gpus:
        values = [gpu.get(f, "[N/A]") for f in fields]
        if nounits:
            values = [v.removesuffix(" MiB") for v in values]
        lines.append(", ".join(values))
    return lines


def main(argv: list[str]) -> int:
    record("nvidia-smi", argv)
    gpus = gpus_from_env(dict(os.environ))
    if not gpus:
        print("No devices were found")
        return 6
    flags = parse_flags(argv)
    if "query-gpu" in flags:
        formats = ",".join(flags.get("format", [])).split(",")
        header = "noheader" not in formats
        fields = flags["query-gpu"][-1].split(",")
        if header:
            print(", ".join(fields))
        print("\n".join(query(gpus, fields, "nounits" in formats)))
        return 0
    if "-L" in argv or "--list-gpus" in argv:
        print("\n".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})" for g in gpus))
        return 0
    print(f"NVIDIA-SMI double | Driver Version: {gpus[0]['driver_version']} | {len(gpus)} GPU(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
