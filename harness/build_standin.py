#!/usr/bin/env python3
"""Build `trtllm-standin:<tag>`: a small image laid out like nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3
where our Dockerfiles and entrypoint look.

Real: tritonserver 2.51.0 with its Python backend (from PyPI's nvidia-pytriton wheel, laid out at /opt/tritonserver
as NGC does; it stays 2.51.0 whatever tag the stand-in claims in TRITON_SERVER_VERSION), Open MPI (Debian's
openmpi-bin) and, for tags from 24.12, Triton's OpenAI frontend (server r24.12's, whatever the tag, with the
in-process `tritonserver` package: harness/realopenai.py). Doubles (tests/doubles), for what needs a GPU or is not
public: the engine (a Python-based `tensorrtllm` backend), trtllm-build, the checkpoint converters and nvidia-smi.

The NGC registry is not reachable from CI, so the base OS is a Debian rootfs made once with debootstrap and
`docker import`ed as trtllm-standin-os:bookworm; each tag is then a short `docker build` FROM it. Nothing is
downloaded inside `docker build` but Debian packages: the wheels are fetched on the host (harness/realtriton.py,
cached) and installed from the build context.

    python harness/build_standin.py --tag 25.01 [--name IMAGE] [--tensorrt-llm VERSION] [--matrix FILE]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `harness.` and `trtllm_images.` importable
    sys.path.insert(0, str(REPO))

from harness import realopenai, realtriton  # noqa: E402
from harness.doubles import DOUBLES_DIR, install_doubles, python_models_origin  # noqa: E402
from harness.upstream_files import UpstreamMissing, upstream_root  # noqa: E402
from trtllm_entrypoint.errors import Error  # noqa: E402
from trtllm_entrypoint.versions import version_tuple  # noqa: E402
from trtllm_images.matrix import DEFAULT_PATH, MatrixEntry, load  # noqa: E402
from trtllm_images.plan import STANDIN_NAME, STANDIN_PYTHON_LABEL, is_standin  # noqa: E402
from trtllm_images.sources import upstream  # noqa: E402

OS_IMAGE = "trtllm-standin-os:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PYTHON_LABEL = STANDIN_PYTHON_LABEL  # build.py verifies a stand-in's images against it
SITE_LABEL = "io.trtllm-images.standin.site-packages"
MODELS_LABEL = "io.trtllm-images.standin.all-models"
PYTHON_MODELS_LABEL = "io.trtllm-images.standin.python-models"
# Where the image keeps the *_double.py scripts that the program wrappers run.
SCRIPTS_DIR = "/opt/trtllm-doubles"
OPENAI_DIR = "/opt/tritonserver/python/openai"  # main.py is at openai_frontend/main.py below it
LOCK_FILE = Path(tempfile.gettempdir()) / "trtllm-standin-os.lock"
HEARTBEAT_S = 30.0  # a line at least this often while a step runs, as the entrypoint's first start does
OPENAI_SOURCES = "triton"  # Triton's core and server sources in the upstream layout (harness/realopenai.py)


class StandinUnavailable(Exception):
    """The stand-in cannot be built here (not root, no debootstrap, no upstream templates): tests skip with this."""


class TemplatesMissing(StandinUnavailable):
    """The upstream templates (outside the repository, in ../shared) are not on this machine."""


@dataclass(frozen=True)
class StandinSpec:
    tag: str
    image: str
    triton: str
    tensorrt_llm: str
    tensorrt: str
    with_app: bool  # NGC images ship /app from 25.01
    openai_frontend: bool
    templates: Path | None  # an all_models directory copied to /app/all_models

    @property
    def models_set(self) -> str | None:
        """Which stored upstream set /app/all_models comes from (`tensorrtllm_backend/v0.17.0`, …)."""
        if self.templates is None:
            return None
        parts = self.templates.parts
        for top in ("tensorrt_llm", "tensorrtllm_backend"):  # the layout's two template trees
            if top in parts:
                return "/".join(parts[len(parts) - 1 - parts[::-1].index(top) :])
        return str(self.templates)

    @property
    def python_models(self) -> str | None:
        """Whose preprocessing/postprocessing/BLS model.py files the image runs: upstream's, or our doubles."""
        return python_models_origin(self.templates) if self.templates else None


@dataclass(frozen=True)
class Standin:
    image: str
    python: str  # Debian's Python in the stand-in (not NGC's): matrix overrides need it
    spec: StandinSpec


def upstream_templates(tensorrt_llm: str, upstream: Path | None = None) -> Path:
    """The stored all_models that matches a TensorRT-LLM version: the newest backend release not newer than it,
    or the TensorRT-LLM snapshot from 0.20 on (the backend moved into that repository)."""
    try:
        upstream = upstream or upstream_root()
    except UpstreamMissing as exc:
        raise TemplatesMissing(str(exc)) from None
    wanted = version_tuple(tensorrt_llm)
    if wanted >= (0, 20):
        candidate = upstream / "tensorrt_llm" / "triton_backend" / "all_models"
        if candidate.is_dir():
            return candidate
        raise TemplatesMissing(f"no TensorRT-LLM backend templates under {candidate}")
    releases = (
        sorted(
            (version_tuple(p.name.lstrip("v")), p) for p in (upstream / "tensorrtllm_backend").glob("v*") if p.is_dir()
        )
        if (upstream / "tensorrtllm_backend").is_dir()
        else []
    )
    older = [path for version, path in releases if version <= wanted]
    if not older:
        raise TemplatesMissing(f"no backend templates <= {tensorrt_llm} under {upstream / 'tensorrtllm_backend'}")
    return older[-1]


def templates_need(tensorrt_llm: str, lock: upstream.Lock | None = None) -> str | None:
    """The layout path of the template set upstream_templates() picks for `tensorrt_llm` among the pinned sources'
    sets (None: no pinned set is old enough)."""
    if version_tuple(tensorrt_llm) >= (0, 20):
        return "tensorrt_llm/triton_backend/all_models"
    lock = lock or upstream.load_lock()
    refs = {
        dest.split("/")[1]
        for pin in lock.pins
        for dest in pin.layout.values()
        if dest.startswith("tensorrtllm_backend/v") and dest.count("/") >= 2
    }
    older = sorted(
        (version_tuple(ref.lstrip("v")), ref)
        for ref in refs
        if version_tuple(ref.lstrip("v")) <= version_tuple(tensorrt_llm)
    )
    return f"tensorrtllm_backend/{older[-1][1]}" if older else None


def upstream_needs(entry: MatrixEntry, tensorrt_llm: str | None = None) -> tuple[str, ...]:
    """What the stand-in of `entry` takes from the upstream files: its template set (images with /app) and, for
    the OpenAI frontend, Triton's sources. Nothing else is fetched for it (no CRD, no other set)."""
    needs = []
    if entry.backend.in_image and (templates := templates_need(tensorrt_llm or entry.tensorrt_llm)):
        needs.append(templates)
    if entry.openai_frontend:
        needs.append(OPENAI_SOURCES)
    return tuple(needs)


def spec_for(
    entry: MatrixEntry, *, image: str | None = None, tensorrt_llm: str | None = None, upstream: Path | None = None
) -> StandinSpec:
    """What the stand-in for `entry` contains; `tensorrt_llm` overrides the installed version (mismatch tests).
    Its name starts with trtllm-standin, so that build.py tags what is built FROM it as a stand-in too."""
    image = image or f"{STANDIN_NAME}:{entry.tag}"
    if not is_standin(image):
        raise Error(f"stand-in name {image!r} must start with {STANDIN_NAME}", "it must never pass for a real image")
    with_app = entry.backend.in_image
    return StandinSpec(
        tag=entry.tag,
        image=image,
        triton=entry.triton or "0.0.0",
        tensorrt_llm=tensorrt_llm or entry.tensorrt_llm,
        tensorrt=entry.tensorrt or "0.0.0",
        with_app=with_app,
        openai_frontend=entry.openai_frontend,
        templates=upstream_templates(entry.tensorrt_llm, upstream) if with_app else None,
    )


def dockerfile_text(spec: StandinSpec, site_dir: str, py: str) -> str:
    """`py` (X.Y) is the OS image's Python: the Python backend's stub links its shared libpython."""
    # Heavy, tag-independent layers first, so that every tag's stand-in shares them.
    lines = [
        f"FROM {OS_IMAGE}",
        "RUN apt-get update && apt-get install -y --no-install-recommends "
        f"openmpi-bin libpython{py} && rm -rf /var/lib/apt/lists/*",
        "COPY wheels/ /tmp/standin-wheels/",
        "RUN python3 -m pip install --no-cache-dir --no-index --find-links /tmp/standin-wheels "
        f"--break-system-packages -r /tmp/standin-wheels/{realtriton.STUB_REQUIREMENTS.name} "
        "&& rm -rf /tmp/standin-wheels",
        "COPY layout/opt/tritonserver/ /opt/tritonserver/",
        "RUN useradd --uid 1000 --user-group --create-home --shell /bin/bash triton-server",
        f"LABEL io.trtllm-images.standin.tag={spec.tag} io.trtllm-images.standin.tensorrt-llm={spec.tensorrt_llm} "
        f"io.trtllm-images.standin.triton-core={realtriton.TRITON_VERSION}",
        *(
            [f"LABEL {MODELS_LABEL}={json.dumps(spec.models_set)} {PYTHON_MODELS_LABEL}={json.dumps(origin)}"]
            if (origin := spec.python_models)
            else []
        ),
        # The claimed version is the tag's (build.py verifies it against the matrix); the core is TRITON_VERSION.
        # Open MPI may start more ranks than this machine has cores, as one rank per GPU would.
        f"ENV TRITON_SERVER_VERSION={spec.triton} TRITON_SERVER_USER=triton-server "
        "LD_LIBRARY_PATH=/opt/tritonserver/lib OMPI_MCA_rmaps_base_oversubscribe=1 "
        "PATH=/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"COPY doubles/ {SCRIPTS_DIR}/",
        "COPY doubles/nvidia_entrypoint_double.sh /opt/nvidia/nvidia_entrypoint.sh",
        "COPY layout/bin/trtllm-build layout/bin/nvidia-smi /usr/local/bin/",
        f"COPY layout/site/ {site_dir}/",
    ]
    if spec.openai_frontend:
        # What NGC images carry for the frontend: its requirements, the in-process `tritonserver` package, and
        # python/openai (harness/realopenai.py builds and fetches them on the host).
        lines += [
            "COPY openai-wheels/ /tmp/openai-wheels/",
            "RUN python3 -m pip install --no-cache-dir --no-index --find-links /tmp/openai-wheels "
            f"--break-system-packages -c /tmp/openai-wheels/{realtriton.STUB_REQUIREMENTS.name} "
            f"{' '.join(repr(r) for r in realopenai.FRONTEND_REQUIREMENTS)} && rm -rf /tmp/openai-wheels",
            f"COPY layout/tritonserver/ {site_dir}/tritonserver/",
            f"COPY layout/openai/ {OPENAI_DIR}/",
        ]
    if spec.with_app:
        lines.append("COPY layout/app/ /app/")
    lines += ["WORKDIR /opt/tritonserver", 'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]', ""]
    return "\n".join(lines)


def assemble_context(spec: StandinSpec, context: Path, site_dir: str, python: str) -> Path:
    """Write the build context for `spec` into the (empty) directory `context`; `python` is the OS image's."""
    shutil.copytree(DOUBLES_DIR, context / "doubles", ignore=shutil.ignore_patterns("__pycache__", "test_*.py"))
    # COPY keeps modes: make the entrypoint executable even from a checkout that lost the bit.
    (context / "doubles" / "nvidia_entrypoint_double.sh").chmod(0o755)
    layout = context / "layout"
    install_doubles(
        layout,
        trtllm_version=spec.tensorrt_llm,
        tensorrt_version=spec.tensorrt,
        with_app=spec.with_app,
        templates_src=spec.templates,
        scripts_dir=SCRIPTS_DIR,
    )
    py = ".".join(python.split(".")[:2])
    try:
        wheels = realtriton.fetch_wheels(py)
        realtriton.install_server(layout, wheels, py)
    except realtriton.RealTritonUnavailable as exc:
        raise StandinUnavailable(f"the real tritonserver for the stand-in: {exc}") from exc
    if spec.openai_frontend:
        add_openai_frontend(context, layout, py)
    (context / "wheels").mkdir()
    for wheel in wheels.glob("*.whl"):
        if wheel != realtriton.server_wheel(wheels):  # unpacked into layout/ already
            shutil.copyfile(wheel, context / "wheels" / wheel.name)
    shutil.copyfile(realtriton.STUB_REQUIREMENTS, context / "wheels" / realtriton.STUB_REQUIREMENTS.name)
    (context / "Dockerfile").write_text(dockerfile_text(spec, site_dir, py))
    return context


def add_openai_frontend(context: Path, layout: Path, py: str) -> None:
    """Triton's real OpenAI frontend (server r24.12) for the stand-in: the `tritonserver` package compiled on this
    host against the stand-in's own libtritonserver, the frontend's sources and its requirements' wheels."""
    if py != realtriton.python_version():
        raise StandinUnavailable(
            f"the OpenAI frontend's `tritonserver` package is compiled for this host's Python "
            f"{realtriton.python_version()}, and the stand-in runs Python {py}"
        )
    try:
        package = realopenai.tritonserver_package(layout / realtriton.PREFIX)
        wheels = realopenai.fetch_wheels(py)
        frontend = realopenai.frontend_dir()
    except realtriton.RealTritonUnavailable as exc:
        raise StandinUnavailable(f"the OpenAI frontend for the stand-in: {exc}") from exc
    shutil.copytree(package / "tritonserver", layout / "tritonserver", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(frontend, layout / "openai", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(wheels, context / "openai-wheels", ignore=shutil.ignore_patterns(".*"))
    shutil.copyfile(realtriton.STUB_REQUIREMENTS, context / "openai-wheels" / realtriton.STUB_REQUIREMENTS.name)


@contextmanager
def heartbeat(log: Callable[[str], None], what: str, every: float = HEARTBEAT_S) -> Iterator[dict[str, str]]:
    """Log `what` with the elapsed time every `every` seconds until the body ends; the body may set `now` in the
    yielded dict to say which part of the step runs."""
    stop, started, state = threading.Event(), time.monotonic(), {"now": ""}

    def beat() -> None:
        while not stop.wait(every):
            now = f" ({state['now']})" if state["now"] else ""
            log(f"  still {what}{now}: {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=beat, name="standin-heartbeat", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join()


def debootstrap_argv(rootfs: Path) -> list[str]:
    return [
        "debootstrap",
        "--variant=minbase",
        "--include=python3,python3-pip,ca-certificates",
        "bookworm",
        str(rootfs),
        DEBIAN_MIRROR,
    ]


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise RuntimeError(f"{' '.join(argv[:3])} … failed with exit code {done.returncode}:\n{tail}")
    return done.stdout.strip()


def _import_rootfs(client, rootfs: Path) -> None:
    python = _run(["chroot", str(rootfs), "python3", "-c", "import platform; print(platform.python_version())"])
    site_dir = _run(["chroot", str(rootfs), "python3", "-c", "import site; print(site.getsitepackages()[0])"])
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."])
        repository, tag = OS_IMAGE.split(":")
        changes = [
            f"LABEL {PYTHON_LABEL}={python} {SITE_LABEL}={site_dir}",
            'CMD ["/bin/bash"]',
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8",
        ]
        client.api.import_image_from_file(str(tarball), repository=repository, tag=tag, changes=changes)


def ensure_os_image(client, log=print) -> None:
    """Create trtllm-standin-os:bookworm once (debootstrap takes minutes; every later call returns at once)."""
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel sessions wait for one debootstrap instead of racing
        try:
            client.images.get(OS_IMAGE)
            return
        except docker.errors.ImageNotFound:
            pass
        if os.geteuid() != 0 or shutil.which("debootstrap") is None:
            raise StandinUnavailable(
                f"{OS_IMAGE} is missing and building it needs root and debootstrap "
                "(apt-get install debootstrap; .ci/run does it)"
            )
        log(f"  building {OS_IMAGE} with debootstrap from {DEBIAN_MIRROR} (once; a few minutes)")
        rootfs = Path(tempfile.mkdtemp(prefix="trtllm-standin-rootfs-", dir="/var/tmp"))
        try:
            with heartbeat(log, "building the base OS") as state:
                state["now"] = "debootstrap"
                _run(debootstrap_argv(rootfs))
                state["now"] = "docker import"
                _import_rootfs(client, rootfs)
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)


def os_image_labels(client) -> dict[str, str]:
    return client.images.get(OS_IMAGE).labels or {}


def build_standin(
    tag: str,
    *,
    image: str | None = None,
    tensorrt_llm: str | None = None,
    matrix_path: Path = DEFAULT_PATH,
    client=None,
    log=print,
) -> Standin:
    """Build (or refresh from Docker's layer cache) the stand-in for `tag`; return its name and Python version.
    Each step logs a line when it starts and a heartbeat while it runs."""
    client = client or docker.from_env()
    entry = load(matrix_path).get(tag)
    needs = upstream_needs(entry, tensorrt_llm)
    log(f"step 1/4: upstream files ({', '.join(needs) or 'none needed'})")
    try:
        root = upstream_root(needs) if needs else None
    except UpstreamMissing as exc:
        raise TemplatesMissing(str(exc)) from None
    spec = spec_for(entry, image=image, tensorrt_llm=tensorrt_llm, upstream=root)
    log(f"step 2/4: base OS image {OS_IMAGE}")
    ensure_os_image(client, log)
    labels = os_image_labels(client)
    with tempfile.TemporaryDirectory(prefix="trtllm-standin-ctx-") as tmp:
        log(
            "step 3/4: build context (tritonserver wheels, doubles"
            + (", OpenAI frontend)" if spec.openai_frontend else ")")
        )
        with heartbeat(log, "assembling the build context"):
            context = assemble_context(spec, Path(tmp), labels[SITE_LABEL], labels[PYTHON_LABEL])
        log(f"step 4/4: docker build {spec.image}")
        output: list[str] = []
        with heartbeat(log, f"building {spec.image}") as state:
            for chunk in client.api.build(
                path=str(context), tag=spec.image, rm=True, forcerm=True, pull=False, decode=True
            ):
                text = chunk.get("stream", "")
                output.append(text)
                if text.startswith("Step "):  # docker's own step line: which instruction runs now
                    state["now"] = text.strip()[:100]
                if "error" in chunk:
                    raise RuntimeError(f"building {spec.image} failed: {chunk['error']}\n{''.join(output[-20:])}")
    log(f"built {spec.image} (TensorRT-LLM {spec.tensorrt_llm}, Python {labels[PYTHON_LABEL]})")
    return Standin(image=spec.image, python=labels[PYTHON_LABEL], spec=spec)


def matrix_for_standin(dest: Path, tag: str) -> Path:
    """A copy of matrix.yaml for builds against the stand-in of `tag`, which a test may edit.

    The stand-in runs Debian's Python, not the NGC image's; it declares that Python in PYTHON_LABEL, and build.py's
    verification takes it from there for anything built FROM a stand-in, so the copy needs no change for it.
    """
    data = yaml.safe_load(DEFAULT_PATH.read_text())
    if not [e for e in data["entries"] if e["tag"] == tag]:
        raise Error(f"tag {tag} is not in {DEFAULT_PATH}")
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", required=True, help="matrix tag, e.g. 25.01")
    parser.add_argument("--name", help="image name, starting with trtllm-standin (default trtllm-standin:<tag>)")
    parser.add_argument("--tensorrt-llm", help="report this TensorRT-LLM version instead of the matrix's")
    parser.add_argument("--matrix", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args(argv)
    try:
        standin = build_standin(
            args.tag,
            image=args.name,
            tensorrt_llm=args.tensorrt_llm,
            matrix_path=args.matrix,
            log=lambda msg: print(msg, file=sys.stderr),
        )
    except (StandinUnavailable, Error, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except docker.errors.DockerException as exc:
        print(f"error: no Docker engine answers ({exc}); start dockerd, or set DOCKER_HOST", file=sys.stderr)
        return 1
    print(f"{standin.image} python={standin.python}")
    print(f"build against it: python build.py --tag {args.tag} --base-image {standin.image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
