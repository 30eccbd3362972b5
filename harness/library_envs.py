#!/usr/bin/env python3
"""Venvs holding the library releases the images carry (tests/library_versions.yaml), built once into the cache.

The container code runs on each image's own huggingface_hub, tokenizers, transformers and jinja2, so its tests run
under those release lines too (tests/unit/test_library_versions.py). Each point of the data file becomes a venv
`<cache>/library-envs/<name>-<key>/`, named by what it holds, made beside its final place and renamed into it when
pip succeeded, so a later run finds it complete or not at all:

    python harness/library_envs.py            # build the missing ones (.ci/run does it), print each one's Python
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

if __package__ in (None, ""):  # run as a script: make `harness.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import realtriton  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "library_versions.yaml"
VENDOR_LOCK = REPO / "vendor.lock.json"


class LibraryEnvUnavailable(Exception):
    """A point cannot be built here (its Python is not installed, pip failed): the message says which and why."""


@dataclass(frozen=True)
class Point:
    name: str
    python: str  # X.Y
    requirements: tuple[str, ...]  # pip requirement strings, every named package pinned

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.python, self.requirements]).encode()).hexdigest()[:12]

    @property
    def directory(self) -> Path:
        return realtriton.cache_root() / "library-envs" / f"{self.name}-{self.key}"

    @property
    def interpreter(self) -> Path:
        return self.directory / "bin" / "python"


def _vendored(names: list[str]) -> list[str]:
    """name==version for the front's private libraries, at the versions vendor.lock.json pins (one fact, one table)."""
    locked = {artifact["name"]: artifact["version"] for artifact in json.loads(VENDOR_LOCK.read_text())["artifacts"]}
    missing = [name for name in names if name not in locked]
    if missing:
        raise ValueError(f"{DATA.name} names {missing} as vendored, and {VENDOR_LOCK.name} does not pin them")
    return [f"{name}=={locked[name]}" for name in names]


def points(path: Path = DATA) -> list[Point]:
    data = yaml.safe_load(path.read_text())
    extra = [*data.get("common", []), *_vendored(data.get("vendored", []))]
    return [
        Point(
            name=point["name"],
            python=str(point["python"]),
            requirements=(*(f"{name}=={version}" for name, version in point["packages"].items()), *extra),
        )
        for point in data["points"]
    ]


def ensure(point: Point, log=print) -> Path:
    """The interpreter of `point`'s venv, built first when it is missing."""
    if point.interpreter.exists():
        return point.interpreter
    base = realtriton.find_python(point.python)
    if base is None:
        raise LibraryEnvUnavailable(
            f"{point.name} needs Python {point.python}, which this machine does not have on PATH or under pyenv"
        )
    with realtriton._locked(point.directory):  # parallel sessions wait for one build
        if point.interpreter.exists():
            return point.interpreter
        scratch = point.directory.with_name(f".{point.directory.name}.tmp")
        shutil.rmtree(scratch, ignore_errors=True)
        log(f"library envs: building {point.name} (Python {point.python}: {' '.join(point.requirements)})")
        started = time.monotonic()
        try:
            subprocess.run([base, "-m", "venv", str(scratch)], check=True, capture_output=True)
            done = subprocess.run(
                [str(scratch / "bin" / "python"), "-m", "pip", "install", "-q", *point.requirements],
                capture_output=True,
                text=True,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            )
            if done.returncode != 0:
                tail = [line for line in (done.stdout + done.stderr).splitlines() if "is ignored" not in line][-5:]
                raise LibraryEnvUnavailable(f"pip install for {point.name} failed: {' | '.join(tail)}")
            # A venv records its own path: it is made in place of the final one, so it must be moved only by rename.
            _retarget(scratch, point.directory)
            scratch.rename(point.directory)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        log(f"library envs: {point.name} built in {time.monotonic() - started:.0f} s")
    return point.interpreter


def _retarget(scratch: Path, final: Path) -> None:
    """Rewrite the venv's own path in its activation scripts and entry points, so that it works once renamed."""
    old, new = str(scratch).encode(), str(final).encode()
    for path in [*(scratch / "bin").iterdir(), scratch / "pyvenv.cfg"]:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if old in data:
                path.write_bytes(data.replace(old, new))


def main() -> int:
    failed = 0
    for point in points():
        try:
            print(f"{point.name}: {ensure(point, log=lambda msg: print(msg, file=sys.stderr, flush=True))}")
        except LibraryEnvUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
