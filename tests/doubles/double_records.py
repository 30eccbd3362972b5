"""What every NVIDIA double shares: recording its invocation (harness/doubles.py reads the records back).

Stdlib only and Python 3.10+: the same file runs inside the stand-in images (Debian's python3) and on the host.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

RECORD_DIR_ENV = "DOUBLE_RECORD_DIR"
DEFAULT_RECORD_DIR = "/tmp/doubles"

# Recorded by value: what our code may legitimately set for the NVIDIA programs.
_VALUE_KEYS = ("MATRIX_TAG", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HOME")
_VALUE_PREFIXES = ("OMPI_", "PMIX_")
# Recorded only as present/absent: a token value must never reach a file, not even a test record.
_SECRET_KEYS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def selected_env(environ: dict[str, str]) -> dict[str, object]:
    env: dict[str, object] = {k: environ[k] for k in _VALUE_KEYS if k in environ}
    env.update({k: v for k, v in environ.items() if k.startswith(_VALUE_PREFIXES)})
    env.update({f"{k}_SET": bool(environ.get(k)) for k in _SECRET_KEYS})
    return env


def record(program: str, argv: list[str], **extra: object) -> dict:
    """Append one JSON line for this invocation to $DOUBLE_RECORD_DIR/<program>.jsonl and return it."""
    entry = {
        "argv": list(argv),
        "env": selected_env(dict(os.environ)),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "time": time.time(),
        **extra,
    }
    directory = Path(os.environ.get(RECORD_DIR_ENV) or DEFAULT_RECORD_DIR)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # One write() of one line on an O_APPEND descriptor: concurrent doubles never interleave within a line.
        fd = os.open(directory / f"{program}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        # A read-only container without the record mount must still behave like the real program.
        print(f"[double] could not record {program}: {exc}", file=sys.stderr)
    return entry


def parse_flags(args: list[str]) -> dict[str, list[str]]:
    """`--k v`, `--k=v` and bare `--k` (value "") into {k: [values...]}; positional words are kept under ""."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
        elif arg.startswith("--"):
            key = arg[2:]
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            value = args[i + 1] if has_value else ""
            i += 1 if has_value else 0
        else:
            key, value = "", arg
        flags.setdefault(key, []).append(value)
        i += 1
    return flags


def last(flags: dict[str, list[str]], key: str, default: str | None = None) -> str | None:
    values = flags.get(key)
    return values[-1] if values else default
