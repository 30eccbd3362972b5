"""Helpers the tests that run the entrypoint as a process share."""

from __future__ import annotations

import socket
from pathlib import Path


def without_tokenizer(model: Path) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    return model


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
