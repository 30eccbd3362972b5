"""A real tritonserver (2.51.0, from PyPI's nvidia-pytriton wheel) for tests and benchmarks, without Docker.

    layout = realtriton.host_layout()                   # fetches the wheels once, unpacks the server once
    with realtriton.start(layout, ["--model-repository=/tmp/repo"]) as server:
        server.http_url                                 # http://127.0.0.1:<free port>; server.log() is its output

The wheel's binary finds its libraries through RPATH `$ORIGIN/../lib`, so it is laid out as NGC lays it:
`<root>/opt/tritonserver/{bin,lib,backends/python,caches}`. The stand-in image (harness/build_standin.py) copies the
same layout to `/opt/tritonserver`. `backends/tensorrtllm/` holds our engine double, a Python-based backend (Triton runs
its `model.py` for every model whose config says `backend: "tensorrtllm"`), because the C++ backend needs a GPU.

Everything downloaded is cached under $XDG_CACHE_HOME/trtllm-images (default ~/.cache/trtllm-images).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

if __package__ in (None, ""):  # run as a script: make `harness.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.doubles import DOUBLES_DIR, write_distribution  # noqa: E402

ENGINE_DOUBLE = DOUBLES_DIR / "tensorrtllm_backend_double" / "model.py"
PYTRITON = "nvidia-pytriton==0.7.0"
TRITON_VERSION = "2.51.0"  # the core inside that wheel (NGC 24.10's), whatever tag a stand-in claims
# What upstream's Python models import (torch CPU, transformers < 5, pillow, requests …), every package pinned.
STUB_REQUIREMENTS = Path(__file__).resolve().parent / "stub-requirements.txt"
# torch's CPU wheels are manylinux_2_28; the others still ship manylinux2014 (2_17) builds.
WHEEL_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
PREFIX = Path("opt/tritonserver")
# The GPU-only `tensorrt` module in the stub's venv is a double: importable, a version, nothing more.
TENSORRT_DOUBLE_VERSION = "0+double"


def fingerprint() -> str:
    """What a cache directory holds: written last into it, so one without it, or with another, is (re)made."""
    return f"{PYTRITON} {STUB_REQUIREMENTS.name} sha256:{hashlib.sha256(STUB_REQUIREMENTS.read_bytes()).hexdigest()}\n"


def cache_key() -> str:
    """Directories are named by what they hold, so checkouts with other pins keep their own instead of redoing one."""
    return hashlib.sha256(fingerprint().encode()).hexdigest()[:12]


class RealTritonUnavailable(Exception):
    """The real server cannot run here (no wheels and no PyPI, no shared libpython …): tests skip with this."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trtllm-images"


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def cache_dir(prefix: str, py: str | None = None) -> Path:
    """Where a cached build of what the pins hold lives: `<prefix>py<X.Y>-<cache_key()>` under cache_root()."""
    return cache_root() / f"{prefix}py{py or python_version()}-{cache_key()}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Parallel sessions wait for one download/unpack instead of racing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        tail = [line for line in (done.stdout + done.stderr).splitlines() if "is ignored" not in line][-5:]
        raise RealTritonUnavailable(f"pip {args[0]} failed: {' | '.join(tail)}")


def stub_requirements(torch: bool = True) -> list[str]:
    """STUB_REQUIREMENTS' pins, torch left out when not `torch`: PyPI has no CPU build of it for every Python, and only
    upstream's BLS model needs it (the ensemble's preprocessing imports it for multimodal requests only)."""
    pins = (line.split("#", 1)[0].strip() for line in STUB_REQUIREMENTS.read_text().splitlines())
    return [pin for pin in pins if pin and (torch or not pin.startswith("torch=="))]


def _torch_prefix(torch: bool) -> str:
    return "" if torch else "no-torch-"


def fetch_wheels(py: str | None = None, dest: Path | None = None, torch: bool = True) -> Path:
    """Download the server wheel and the stub's packages (for Python `py`, torch only if `torch`) into `dest`, once;
    return `dest`."""
    py = py or python_version()
    dest = dest or cache_dir(f"wheels/{_torch_prefix(torch)}", py)
    done = dest / ".complete"
    with _locked(dest):
        if done.exists() and done.read_text() == fingerprint():
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        binary = ["download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
        _pip(*binary, "--no-deps", "--platform", "manylinux_2_35_x86_64", PYTRITON)
        platforms = [arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)]
        _pip(*binary, "--python-version", py, "--implementation", "cp", *platforms, *stub_requirements(torch))
        done.write_text(fingerprint())
    return dest


def server_wheel(wheels: Path) -> Path:
    name = PYTRITON.split("==")[0].replace("-", "_")
    found = sorted(wheels.glob(f"{name}-{PYTRITON.split('==')[1]}-*.whl"))
    if not found:
        raise RealTritonUnavailable(f"no {PYTRITON} wheel in {wheels}")
    return found[-1]


def _extract(archive: zipfile.ZipFile, member: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(member) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    target.chmod(0o755)


def install_server(root: Path, wheels: Path, py: str) -> Path:
    """Lay the wheel's server out under `root` as NGC does (opt/tritonserver/…) with the stub for Python `py` and
    the engine double as the `tensorrtllm` backend; return <root>/opt/tritonserver."""
    home = root / PREFIX
    stubs = "pytriton/tritonserver/python_backend_stubs/"
    with zipfile.ZipFile(server_wheel(wheels)) as archive:
        for member in archive.namelist():
            if member.endswith("/"):
                continue
            name = member.rsplit("/", 1)[-1]
            if member.startswith("nvidia_pytriton.libs/"):
                _extract(archive, member, home / "lib" / name)
            elif member.startswith(f"{stubs}{py}/"):
                _extract(archive, member, home / "backends" / "python" / name)
            elif member.startswith("pytriton/tritonserver/") and not member.startswith(stubs):
                _extract(archive, member, home / member.removeprefix("pytriton/tritonserver/"))
    if not (home / "backends" / "python" / "triton_python_backend_stub").exists():
        raise RealTritonUnavailable(f"{server_wheel(wheels).name} has no Python backend stub for Python {py}")
    install_engine_double(home)
    return home


def install_engine_double(home: Path) -> Path:
    """(Re)place the engine double under <home>/backends/tensorrtllm; atomic, so running servers never see half."""
    target = home / "backends" / "tensorrtllm" / "model.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".model.py.{os.getpid()}")
    shutil.copyfile(ENGINE_DOUBLE, staging)
    staging.chmod(0o644)
    os.replace(staging, target)
    return target


def private_backends(layout: Layout, root: Path) -> str:
    """`--backend-directory` of a test's own: Triton's Python backend as installed (3 MB) and this checkout's engine
    double. The shared cache's double is whichever checkout installed one last, and a server that loads another's
    mid-test would not do what this checkout's does."""
    backends = root / "backends"
    shutil.copytree(layout.backends / "python", backends / "python", symlinks=True)
    (backends / "tensorrtllm").mkdir()
    shutil.copyfile(ENGINE_DOUBLE, backends / "tensorrtllm" / "model.py")
    return f"--backend-directory={backends}"


def install_stub_venv(venv: Path, wheels: Path, python: str | None = None, torch: bool = True) -> Path:
    """A virtualenv of `python` (default: the running one) with STUB_REQUIREMENTS (torch only if `torch`) from the
    wheel cache (no network), and the `tensorrt` double (harness/doubles.py) that v0.12.0's preprocessing imports.

    The stub embeds Python in isolated mode: it ignores PYTHONPATH and takes its prefix (so its site-packages)
    from the first `python3` on PATH. A venv first on the server's PATH is how its packages are chosen."""
    done = subprocess.run(
        [python or sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RealTritonUnavailable(f"python -m venv failed: {done.stderr.strip()[-300:]}")
    pip = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(wheels),
            *stub_requirements(torch),
        ],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        raise RealTritonUnavailable(f"installing {STUB_REQUIREMENTS.name} failed: {pip.stderr.strip()[-300:]}")
    [site] = venv.glob("lib/python*/site-packages")
    write_distribution(site, "tensorrt", TENSORRT_DOUBLE_VERSION)
    return venv


@dataclass(frozen=True)
class Layout:
    """An unpacked server on this host, and what a process needs to run it."""

    home: Path  # …/opt/tritonserver
    venv: Path  # the stub's Python and packages
    libpython_dir: Path

    @property
    def binary(self) -> Path:
        return self.home / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.home / "backends"

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        libs = [str(self.home / "lib"), str(self.libpython_dir), env.get("LD_LIBRARY_PATH", "")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in libs if p)
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(self.venv)
        return env


_ASK_PYTHON = (
    "import sys, sysconfig; print(f'{sys.version_info[0]}.{sys.version_info[1]}'); "
    "print(sysconfig.get_config_var('LIBDIR') or ''); print(sysconfig.get_config_var('INSTSONAME') or '')"
)


def _interpreter(python: str) -> tuple[str, Path]:
    """X.Y of the interpreter `python`, and the directory of its shared libpython3.X.so.1.0, which the stub links."""
    try:
        done = subprocess.run([python, "-c", _ASK_PYTHON], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RealTritonUnavailable(f"cannot run {python}: {exc}") from None
    if done.returncode != 0:
        raise RealTritonUnavailable(f"{python} failed: {done.stderr.strip()[-300:]}")
    py, libdir, library = done.stdout.splitlines()
    if libdir and library and (Path(libdir) / library).exists():
        return py, Path(libdir)
    raise RealTritonUnavailable(
        f"no shared libpython{py} beside {python}: the Python backend's stub needs it "
        f"(Debian: apt-get install libpython{py}; pyenv: build with PYTHON_CONFIGURE_OPTS=--enable-shared)"
    )


def find_python(version: str) -> str | None:
    """A working Python `version` (X.Y) from PATH or a pyenv install, if this machine has one."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    installed = sorted(pyenv.glob(f"versions/{version}.*/bin/python{version}"))
    for candidate in [shutil.which(f"python{version}"), *map(str, installed)]:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


def host_layout(root: Path | None = None, python: str | None = None, torch: bool = True) -> Layout:
    """The server unpacked under the cache (once per Python version) plus its packages, for the stub of `python`
    (an interpreter; default: the running one), with torch only if `torch`; the engine double is refreshed on every
    call so an edited double is what runs."""
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        raise RealTritonUnavailable("the tritonserver wheel runs on Linux x86_64 only")
    python = python or sys.executable
    py, libpython_dir = _interpreter(python)
    root = root or cache_dir(f"tritonserver-{TRITON_VERSION}-{_torch_prefix(torch)}", py)
    done = root / ".complete"
    with _locked(root):
        if not (done.exists() and done.read_text() == fingerprint()):
            wheels = fetch_wheels(py, torch=torch)
            shutil.rmtree(root / "opt", ignore_errors=True)
            install_server(root, wheels, py)
            install_stub_venv(root / "venv", wheels, python, torch)
            done.write_text(fingerprint())
        home = root / PREFIX
        install_engine_double(home)
    return Layout(home=home, venv=root / "venv", libpython_dir=libpython_dir)


# --- running it -----------------------------------------------------------------------------------------------------

ADMIN_HEADER = "admin-key"  # the header (HTTP) that Triton's restricted APIs want, as the entrypoint configures them


def with_admin_key(argv: Sequence[str], key: str) -> list[str]:
    """`prepare` prints its launch command with the admin key left out (job logs keep that output); put `key`, the
    TRITON_ADMIN_KEY it was given, back where `serve` would have it."""
    return [arg + key if arg.endswith(f":{ADMIN_HEADER}=") else arg for arg in argv]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def log_summary(text: str) -> str:
    """A failed server's log, short: its error lines (where Triton names a model that failed to load, and why)
    and its end."""
    errors = [line[:1500] for line in text.splitlines() if line.startswith("E") or "rror" in line][:20]
    return "its errors:\n" + "\n".join(errors) + f"\nits log ends:\n{text[-3000:]}"


@dataclass
class RunningServer:
    # Where readiness is asked and what the errors call it (harness/realfront.py's front answers elsewhere).
    READY_ROUTE: ClassVar[str] = "/v2/health/ready"
    NAME: ClassVar[str] = "tritonserver"

    process: subprocess.Popen
    argv: list[str]
    http_port: int
    grpc_port: int
    log_path: Path
    log_file: IO[bytes] | None = field(repr=False, default=None)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}{self.READY_ROUTE}", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.NAME} exited with {self.process.returncode} before ready; {log_summary(self.log())}"
                )
            if self.ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{self.NAME} not ready within {timeout_s}s; {log_summary(self.log())}")

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, as `docker stop` sends it; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log_file:
            self.log_file.close()
        return self.process.returncode


def server_argv(layout: Layout, args: Sequence[str]) -> tuple[list[str], int, int]:
    """`tritonserver args…` with free ports for those `args` leave unset and this layout's backend directory.
    `args` may start with the program (an entrypoint's launch argv): it is replaced by this layout's binary."""
    args = list(args[1:] if args and args[0].endswith("tritonserver") else args)
    ports = {}
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        value = _flag_value(args, flag)
        if value is None:
            value = str(free_port())
            args.append(f"{flag}={value}")
        ports[flag] = int(value)
    if _flag_value(args, "--backend-directory") is None:
        args.append(f"--backend-directory={layout.backends}")
    if _flag_value(args, "--cache-directory") is None:
        args.append(f"--cache-directory={layout.home / 'caches'}")
    return [str(layout.binary), *args], ports["--http-port"], ports["--grpc-port"]


@contextmanager
def start(
    layout: Layout,
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    ready_timeout_s: float = 120,
    wait: bool = True,
) -> Iterator[RunningServer]:
    """Run tritonserver with `args` until the block ends (then SIGTERM). Waits for /v2/health/ready unless
    wait=False. The log goes to a file in `log_dir` (default: a temporary directory)."""
    argv, http_port, grpc_port = server_argv(layout, args)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tritonserver-log-"))
    log_path = log_dir / f"tritonserver-{http_port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 (open for the server's lifetime; RunningServer closes it)
    process = subprocess.Popen(
        argv, env=layout.environ(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = RunningServer(process, argv, http_port, grpc_port, log_path, log)
    try:
        if wait:
            server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()


if __name__ == "__main__":  # `python harness/realtriton.py`: fetch and unpack, print where it is
    print(host_layout().home)
