"""Triton's own OpenAI frontend (server r24.12's `python/openai`) on the real 2.51.0 core, for the stand-in images of
tags from 24.12, which carry it as NGC images do (docs/openai.md runs it by hand). Built from the byte-exact
upstream sources under ../shared/upstream/triton (never copied into this repository):

    package = realopenai.tritonserver_package(home)     # the in-process `tritonserver` package, compiled once
    wheels = realopenai.fetch_wheels(py)                # the frontend's requirements, for the stand-in's context

The package is what NGC images carry in site-packages: core r24.10's Python API (C API 1.34, that of 2.51's
library) with its pybind11 extension compiled here against the wheel's libtritonserver. The extension is linked
with DT_RPATH /opt/tritonserver/lib, as upstream's CMake sets it: in an image that finds the library and, DT_RPATH
being transitive, the libraries it needs (they carry no RUNPATH); on this host LD_LIBRARY_PATH does the same.
Everything built or downloaded is cached under $XDG_CACHE_HOME/trtllm-images, like the server wheels.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `harness.` importable
    sys.path.insert(0, str(REPO))

from harness import realtriton  # noqa: E402
from harness.upstream_files import UpstreamMissing, upstream_root  # noqa: E402

CORE = "core-r24.10"  # Triton 2.51.0's core: the same C API (1.34) as the wheel's library
SERVER = "server-r24.12"  # the first server branch whose NGC image ships the frontend
PACKAGE_SOURCES = ("__init__.py", "py.typed", "_api", "_c")
BINDINGS = "python/tritonserver/_c/tritonserver_pybind.cc"
# Its requirements.txt, and transformers < 5 (5.x breaks its tokenizer helper: `all_special_tokens_extended`).
FRONTEND_REQUIREMENTS = (
    "fastapi==0.115.6",
    "httpx==0.27.2",
    "openai==1.40.6",
    "starlette>=0.40.0",
    "uvicorn",
    "transformers<5",
)
RUNTIME_LIBRARY_DIR = "/opt/tritonserver/lib"  # DT_RPATH of the extension, as upstream's CMake sets it
COMPILE_FLAGS = ("-O2", "-fPIC", "-fvisibility=hidden", "-std=c++17")


class FrontendUnavailable(realtriton.RealTritonUnavailable):
    """The frontend cannot run here (no sources, no compiler or pybind11, no PyPI): tests skip with this."""


def sources() -> Path:
    try:
        root = upstream_root(("triton",)) / "triton"
    except UpstreamMissing as exc:
        raise FrontendUnavailable(str(exc)) from None
    main = root / SERVER / "python/openai/openai_frontend/main.py"
    if not (root / CORE / BINDINGS).is_file() or not main.is_file():
        raise FrontendUnavailable(f"no {CORE}/{SERVER} sources under {root} (see its SOURCES.md)")
    return root


def frontend_dir() -> Path:
    """What the images carry at /opt/tritonserver/python/openai (tests excluded upstream already)."""
    return sources() / SERVER / "python" / "openai"


def _digest(paths: Sequence[Path], extra: str) -> str:
    sha = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        sha.update(str(path.name).encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()[:16]


def _pybind11_includes() -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pybind11", "--includes"], capture_output=True, text=True)
    if done.returncode != 0:
        raise FrontendUnavailable("pybind11 is not installed (pip install pybind11; .ci/run does it)")
    return done.stdout.split()


def _library(home: Path) -> Path:
    found = sorted((home / "lib").glob("libtritonserver*.so"))
    if not found:
        raise FrontendUnavailable(f"no libtritonserver*.so in {home / 'lib'}")
    return found[0]


def tritonserver_package(home: Path) -> Path:
    """The directory holding the built `tritonserver` package (put it on PYTHONPATH or copy it to site-packages),
    compiled for this host's Python against the libtritonserver of the server laid out at `home`."""
    core = sources() / CORE
    package_src = core / "python" / "tritonserver"
    files = [p for p in package_src.rglob("*") if p.is_file()] + [core / "include/triton/core/tritonserver.h"]
    library = _library(home)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    key = _digest(files, f"{realtriton.python_version()} {library.name} {' '.join(COMPILE_FLAGS)} {suffix}")
    root = realtriton.cache_root() / f"tritonserver-python-{realtriton.TRITON_VERSION}-py{realtriton.python_version()}"
    dest = root / key
    if (dest / ".complete").exists():
        return dest
    if shutil.which("g++") is None:
        raise FrontendUnavailable("no C++ compiler (apt-get install g++; .ci/run does it)")
    includes = _pybind11_includes()
    with realtriton._locked(root / key):
        if (dest / ".complete").exists():
            return dest
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            package = staging / "tritonserver"
            package.mkdir()
            for name in PACKAGE_SOURCES:
                src = package_src / name
                if src.is_dir():
                    shutil.copytree(src, package / name, ignore=shutil.ignore_patterns("*.cc", "__pycache__"))
                else:
                    shutil.copyfile(src, package / name)
            obj = staging / "bindings.o"
            compile_argv = ["g++", *COMPILE_FLAGS, *includes, f"-I{core / 'include'}", "-c", str(core / BINDINGS)]
            _run([*compile_argv, "-o", str(obj)])
            _run(
                [
                    "g++",
                    "-shared",
                    "-o",
                    str(package / "_c" / f"triton_bindings{suffix}"),
                    str(obj),
                    f"-L{library.parent}",
                    f"-l:{library.name}",
                    f"-Wl,--disable-new-dtags,-rpath,{RUNTIME_LIBRARY_DIR}",
                ]
            )
            obj.unlink()
            (staging / ".complete").write_text(key + "\n")
            os.replace(staging, dest)  # published whole, or not at all
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return dest


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise FrontendUnavailable(f"{argv[0]} failed: {(done.stdout + done.stderr).strip()[-1500:]}")


def _fingerprint() -> str:
    return f"{realtriton.fingerprint().strip()} {' '.join(FRONTEND_REQUIREMENTS)}\n"


def fetch_wheels(py: str | None = None) -> Path:
    """Wheels of FRONTEND_REQUIREMENTS for Python `py`, downloaded once and held to the Python models' pins
    (harness/stub-requirements.txt): the stand-in installs both sets from its context."""
    py = py or realtriton.python_version()
    dest = realtriton.cache_dir("wheels/openai-", py)
    with realtriton._locked(dest):
        done = dest / ".complete"
        if done.exists() and done.read_text() == _fingerprint():
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        platforms = [arg for platform in realtriton.WHEEL_PLATFORMS for arg in ("--platform", platform)]
        argv = ["download", "--quiet", "--only-binary=:all:", "--dest", str(dest), "--python-version", py]
        constraints = ["-c", str(realtriton.STUB_REQUIREMENTS)]
        realtriton._pip(*argv, "--implementation", "cp", *platforms, *constraints, *FRONTEND_REQUIREMENTS)
        done.write_text(_fingerprint())
    return dest


if __name__ == "__main__":  # `python harness/realopenai.py`: build and fetch once, print where they are
    print(tritonserver_package(realtriton.host_layout().home))
    print(fetch_wheels())
