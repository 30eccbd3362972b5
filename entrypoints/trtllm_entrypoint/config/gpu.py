"""Which GPUs this process may use, from `nvidia-smi` (always mounted by the NVIDIA container runtime)."""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from trtllm_entrypoint.errors import EntrypointError

QUERY_FIELDS = "index,name,compute_cap,memory.total,driver_version,uuid"
NVIDIA_SMI_ARGV = ("nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT_SECS = 20
NO_DEVICES = "No devices were found"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str  # "9.0"
    memory_mib: int
    uuid: str = ""  # "GPU-6d70…"; lets CUDA/NVIDIA_VISIBLE_DEVICES name GPUs by UUID


@dataclass(frozen=True)
class GpuInfo:
    gpus: tuple[Gpu, ...]
    driver: str | None

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gpus)

    @property
    def compute_capability(self) -> str | None:
        """The one compute capability of the visible GPUs; None without GPUs. Engines are built per capability."""
        found = sorted({g.compute_capability for g in self.gpus})
        if len(found) > 1:
            raise EntrypointError(
                f"the visible GPUs have different compute capabilities ({', '.join(found)})",
                "an engine is built for one GPU type: set CUDA_VISIBLE_DEVICES to GPUs of one model",
            )
        return found[0] if found else None


def _mib(text: str) -> int:
    number = text.split()[0] if text.split() else ""
    return int(number) if number.isascii() and number.isdigit() else 0  # "[N/A]" on some virtual GPUs


def parse_nvidia_smi(csv_text: str) -> GpuInfo:
    """Parse the output of NVIDIA_SMI_ARGV: index, name, compute_cap, memory.total, driver_version[, uuid] per line."""
    gpus: list[Gpu] = []
    drivers: list[str] = []
    for row in csv.reader(csv_text.splitlines(), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) not in (5, 6) or not (row[0].strip().isascii() and row[0].strip().isdigit()):
            raise EntrypointError(
                f"could not parse this nvidia-smi line: {', '.join(row)!r}",
                "run `nvidia-smi` in the container to see whether the driver works",
            )
        cells = [c.strip() for c in row]
        gpus.append(
            Gpu(
                index=int(cells[0]),
                name=cells[1],
                compute_capability=cells[2],
                memory_mib=_mib(cells[3]),
                uuid=cells[5] if len(cells) == 6 else "",
            )
        )
        drivers.append(cells[4])
    return GpuInfo(gpus=tuple(gpus), driver=drivers[0] if drivers else None)


def _pick(gpus: tuple[Gpu, ...], entry: str) -> Gpu | None:
    """The GPU an entry of a visible-devices list names: an index, or a UUID (or its unique prefix, as CUDA allows)."""
    if entry.isascii() and entry.isdigit():  # str.isdigit() alone accepts "²", which int() refuses
        return next((g for g in gpus if g.index == int(entry)), None)
    matches = [g for g in gpus if g.uuid and entry.startswith("GPU-") and g.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def _apply_cuda_visible(gpus: tuple[Gpu, ...], value: str) -> tuple[Gpu, ...]:
    # CUDA's rule: devices in the listed order, up to the first entry that names no device; "" hides all.
    picked: list[Gpu] = []
    for entry in (e.strip() for e in value.split(",")):
        gpu = _pick(gpus, entry)
        if gpu is None or gpu in picked:
            break
        picked.append(gpu)
    return tuple(picked)


def _apply_nvidia_visible(gpus: tuple[Gpu, ...], value: str) -> tuple[Gpu, ...]:
    lowered = value.strip().lower()
    if lowered in ("", "none", "void"):
        return ()
    if lowered == "all":
        return gpus
    entries = [e.strip() for e in value.split(",") if e.strip()]
    picked = [_pick(gpus, e) for e in entries]
    # The container runtime already applied this list and renumbered the GPUs from 0: a list that names GPUs
    # nvidia-smi does not show describes the host, and every GPU shown is one of them.
    if any(g is None for g in picked):
        return gpus
    return tuple(g for g in gpus if g in picked)


@dataclass(frozen=True)
class Visibility:
    """NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES as given (None: unset; an empty value hides every GPU)."""

    nvidia: str | None = None
    cuda: str | None = None


def visible(info: GpuInfo, visibility: Visibility) -> GpuInfo:
    """Keep the GPUs that NVIDIA_VISIBLE_DEVICES and then CUDA_VISIBLE_DEVICES leave visible."""
    gpus = info.gpus
    if visibility.nvidia is not None:
        gpus = _apply_nvidia_visible(gpus, visibility.nvidia)
    if visibility.cuda is not None:
        gpus = _apply_cuda_visible(gpus, visibility.cuda)
    return GpuInfo(gpus=gpus, driver=info.driver)


def detect_gpus(
    visibility: Visibility, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> GpuInfo:
    """The usable GPUs; none when nvidia-smi is missing or finds no device (the image started without --gpus)."""
    try:
        done = run(list(NVIDIA_SMI_ARGV), capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_SECS, check=False)
    except FileNotFoundError:
        return GpuInfo(gpus=(), driver=None)
    except subprocess.TimeoutExpired:
        raise EntrypointError(
            f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_SECS} s",
            "the GPU driver may be stuck: check `nvidia-smi` on the host",
        ) from None
    if done.returncode != 0 or NO_DEVICES in (done.stdout or ""):
        return GpuInfo(gpus=(), driver=None)
    return visible(parse_nvidia_smi(done.stdout), visibility)


def require_gpus(info: GpuInfo, needed: int, why: str) -> None:
    if info.count >= needed:
        return
    seen = f"{info.count} GPU is visible" if info.count == 1 else f"{info.count} GPUs are visible"
    raise EntrypointError(
        f"{why} needs {needed} GPU{'s' if needed != 1 else ''}, but {seen}",
        "start the container with `--gpus all` (or a Kubernetes nvidia.com/gpu limit), check CUDA_VISIBLE_DEVICES, "
        "or lower TP_SIZE x PP_SIZE",
    )
