"""The serving benchmarks on the lent 16-core machine (docs/benchmarks.md, "On the 16-core machine").

That machine has Python 3.12 with torch built for numpy 2, no network and no compiler we rely on, and a command
there sees only what travels with the checkout (64 MiB). So `pack`, here, builds a kit of xz archives, and `run`,
there, lays it out and runs `python -m benchmarks` suites on it:

    python -m benchmarks.device pack KIT          # here: needs PyPI for the cp312 wheels (cached after once)
    tar -xJf KIT/code.tar.xz -C /tmp/code && python3 /tmp/code/benchmarks/device.py run KIT "$OUT"   # there

The kit: this checkout's tracked files and the upstream templates the sandbox's tag uses (code), the real
tritonserver 2.51 laid out as harness/realtriton.py lays it, with only the Python 3.12 stub (server), the stub's
packages for cp312 without torch (stub), and the harness's packages (harness). `run` makes the stub's virtualenv
from the machine's Python, with the machine's own torch after our packages on its path (upstream's BLS model
imports torch; ours carry numpy < 2, which the 2.51 stub needs), and writes each suite's table and JSON to the
output folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Run as a script there: `benchmarks.`, `harness.` and both packages importable (their packages come with the kit).
for _path in (REPO / "entrypoints", REPO):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

PY = "3.12"  # the machine's Python (3.12.3), as in NGC images from 24.12
# The templates the suites' tags fill from: 25.01 (engine workflow) and 26.07 (llmapi, the openai suite's second).
TAG_UPSTREAM = ("tensorrtllm_backend/v0.17.0", "tensorrt_llm/triton_backend")
# The stub's packages: stub-requirements.txt without torch and what only torch needs; hf_xet only downloads.
NOT_IN_STUB = {"torch", "sympy", "mpmath", "networkx", "setuptools", "hf_xet"}
# What `python -m benchmarks` and our OpenAI front (run by the same Python) import on top of the machine's packages,
# less what the machine has (numpy 2 and ml_dtypes, which its jax brings, serve the load generator; tokenizers).
HARNESS = (
    *("click", "Jinja2", "PyYAML", "docker", "packaging", "pytest", "tritonclient[grpc]", "aiohttp", "msgspec"),
    "py-spy",  # the openai suite's profile when a target is missed (its binary is kept in site-packages)
)
ON_THE_MACHINE = ("numpy", "numpy.libs", "ml_dtypes")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
# The machine's GPU is visible: tritonserver would collect GPU metrics through DCGM, which this CPU serving does
# not need; the wrapper turns them off for every start, whichever suite builds the command line.
WRAPPER = '#!/bin/sh\nexec "$(dirname "$0")/tritonserver.bin" "$@" --allow-gpu-metrics=false\n'
SUITES = ("serving", "openai")


def _tar(dest: Path, members: list[tuple[Path, str]]) -> Path:
    with tarfile.open(dest, "w:xz", preset=9) as archive:
        for path, name in members:
            archive.add(path, arcname=name)
    return dest


def _pip_target(site: Path, packages: list[str], *, find_links: Path | None = None) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(site)]
    argv += ["--python-version", PY, "--implementation", "cp", "--only-binary=:all:"]
    argv += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    if find_links is not None:
        argv += ["--no-index", "--no-deps", "--find-links", str(find_links)]
    subprocess.run([*argv, *packages], check=True)


def _prune(site: Path) -> None:
    """What no suite runs: tests, caches and console scripts (their shebangs name this machine's Python)."""
    for path in list(site.rglob("__pycache__")) + list(site.glob("*/tests")) + [site / "bin"]:
        shutil.rmtree(path, ignore_errors=True)


def pack(kit: Path) -> None:
    """The code archive always (it is this checkout); the others only when missing: they follow the pins alone, so
    delete them after a pin changes."""
    from harness import realtriton

    kit.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="device-kit-") as tmp:
        work = Path(tmp)
        pack_code(kit / "code.tar.xz")
        wheels = realtriton.fetch_wheels(PY, torch=False)
        if not (kit / "server.tar.xz").is_file():
            pack_server(kit / "server.tar.xz", wheels, work / "server")
        if not (kit / "stub.tar.xz").is_file():
            pack_site(kit / "stub.tar.xz", work / "stub", stub=True, wheels=wheels)
        if not (kit / "harness.tar.xz").is_file():
            pack_site(kit / "harness.tar.xz", work / "harness", stub=False, wheels=wheels)
    for archive in sorted(kit.glob("*.tar.xz")):
        print(f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB")


def pack_code(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    members = [(REPO / name, name) for name in files.decode().split("\0") if name and (REPO / name).is_file()]
    from harness.upstream_files import upstream_root

    members += [(upstream_root() / part, f"_upstream/{part}") for part in TAG_UPSTREAM]
    _tar(dest, members)


def pack_server(dest: Path, wheels: Path, root: Path) -> None:
    from harness import realtriton

    home = realtriton.install_server(root, wheels, PY)
    for library in (home / "lib").glob("libpython3*"):  # the wheel's own Python 3.13, which no stub here links
        library.unlink()
    binary = home / "bin" / "tritonserver"
    binary.rename(binary.with_name("tritonserver.bin"))
    binary.write_text(WRAPPER)
    binary.chmod(0o755)
    _tar(dest, [(root / "opt", "opt")])


def pack_site(dest: Path, site: Path, *, stub: bool, wheels: Path) -> None:
    from harness import realtriton
    from harness.doubles import write_distribution

    if stub:
        pins = [p for p in realtriton.stub_requirements(torch=False) if p.split("==")[0].lower() not in NOT_IN_STUB]
        _pip_target(site, pins, find_links=wheels)
        write_distribution(site, "tensorrt", realtriton.TENSORRT_DOUBLE_VERSION)
    else:
        _pip_target(site, list(HARNESS))
        (site / "bin" / "py-spy").replace(site / "py-spy")  # a static binary, kept from the scripts pruned below
        for name in ON_THE_MACHINE:
            for path in [site / name, *site.glob(f"{name}-*.dist-info")]:
                shutil.rmtree(path, ignore_errors=True)
    _prune(site)
    _tar(dest, [(site, "site-packages")])


def _say(message: str) -> None:
    print(f"[device] {message}", file=sys.stderr, flush=True)


def lay_out(kit: Path, root: Path, torch_site: Path | None) -> dict[str, str]:
    """The kit unpacked under `root`, the server where serving_bench.layout() finds it complete; the environment
    the suites run in."""
    with tarfile.open(kit / "harness.tar.xz") as archive:
        archive.extractall(root / "harness", filter="tar")
    sys.path.insert(0, str(root / "harness" / "site-packages"))  # before the machine's, as PYTHONPATH puts it below
    from harness import realtriton

    os.environ["XDG_CACHE_HOME"] = str(root / "cache")
    server = realtriton.cache_dir(f"bench-tritonserver-{realtriton.TRITON_VERSION}-", PY)
    venv = server / "venv"
    with tarfile.open(kit / "server.tar.xz") as archive:
        archive.extractall(server, filter="tar")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python*/site-packages")
    with tarfile.open(kit / "stub.tar.xz") as archive:
        archive.extractall(site.parent, filter="tar")
    if torch_site is not None and (torch_site / "torch").is_dir():
        # After ours on the path: our numpy 1.26 and transformers 4 win, torch comes from the machine.
        (site / "zz-machine-torch.pth").write_text(f"{torch_site}\n")
    (server / ".complete").write_text(realtriton.fingerprint())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "entrypoints"), str(root / "harness" / "site-packages")])
    env["TRTLLM_UPSTREAM_DIR"] = str(REPO / "_upstream")
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = os.pathsep.join([str(root / "harness" / "site-packages"), env.get("PATH", "")])
    # transformers 4 would import the machine's torch and jax (built for numpy 2) into every tokenizer model, which
    # needs neither: its framework switches off (the BLS model imports torch itself).
    env.update(USE_TORCH="0", USE_TF="0", USE_FLAX="0")
    return env


# What upstream's v0.17.0 preprocessing and BLS import at load, in the stub's Python (isolated, as the stub runs it).
PROBE = """import sys, numpy, transformers
print(sys.version.split()[0], 'numpy', numpy.__version__, 'transformers', transformers.__version__)
import requests
from PIL import Image
from transformers import AutoProcessor, AutoTokenizer, T5Tokenizer
print('preprocessing imports: ok')
import torch
from torch.utils.dlpack import from_dlpack
print('torch', torch.__version__)
"""


def _probe(env: dict[str, str], venv: Path) -> None:
    """What the stub's Python sees: a failure here explains a failed suite below."""
    argv = [str(venv / "bin" / "python3"), "-I", "-c", PROBE]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    _say(f"stub's Python (exit {done.returncode}): {(done.stdout + done.stderr).strip()[-1500:]}")


def run(kit: Path, out: Path, suites: list[str], quick: list[str], torch_site: Path | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="device-bench-"))
    env = lay_out(kit, root, torch_site)
    _probe(env, next(root.glob("cache/*/bench-*/venv")))
    _say(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]} at {sys.executable}")
    worst = 0
    for suite in suites:
        argv = [sys.executable, "-m", "benchmarks", "--only", suite, "--markdown", "--json", str(out / f"{suite}.json")]
        argv += ["--quick"] if suite in quick else []
        argv += ["--plot", str(out / "serving-throughput.png"), "--no-ready"] if suite == "serving" else []
        began = time.monotonic()
        with open(out / f"{suite}.log", "w") as log:
            done = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        (out / f"{suite}.md").write_text(done.stdout)
        for extra in sorted((REPO / "out").glob("*")):  # the plots and a missed target's profile
            shutil.copy2(extra, out / extra.name)
        _say(f"{suite}: exit {done.returncode} after {time.monotonic() - began:.0f} s\n{done.stdout}")
        worst = max(worst, done.returncode)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("pack", help="build the kit here").add_argument("kit", type=Path)
    there = verbs.add_parser("run", help="lay the kit out and run the suites (on the lent machine)")
    there.add_argument("kit", type=Path)
    there.add_argument("out", type=Path, help="where the tables, JSON and logs go")
    there.add_argument("--only", action="append", choices=SUITES, help=f"repeatable [{' '.join(SUITES)}]")
    there.add_argument(
        "--quick", action="append", default=[], choices=SUITES, help="run this suite --quick (repeatable)"
    )
    there.add_argument(
        "--torch-site",
        type=Path,
        default=Path(f"/opt/torch/.venv/lib/python{PY}/site-packages"),
        help="the machine's site-packages that hold torch, for upstream's BLS model [%(default)s]",
    )
    args = parser.parse_args(argv)
    if args.verb == "pack":
        pack(args.kit)
        return 0
    return run(args.kit.resolve(), args.out.resolve(), args.only or list(SUITES), args.quick, args.torch_site)


if __name__ == "__main__":
    sys.exit(main())
