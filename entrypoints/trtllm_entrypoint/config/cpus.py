"""How many CPUs this container may use, and the Python model instance counts derived from it.

`os.cpu_count()` is the host's count: a pod limited to 4 CPUs on a 64-core node sees 64. The limit lives in the
cgroup's CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`) and in the CPU affinity mask
(`docker run --cpuset-cpus`, Kubernetes' static CPU manager). The usable count is the smaller of the two.

The parsing is pure (file contents in, a number out); `usable_cpus()` is the thin shell that reads the files.
Container runtimes mount the container's own cgroup at /sys/fs/cgroup (a cgroup namespace on v2, the cgroup's
directory on v1), so the files are read there.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# v1 mounts the cpu controller as `cpu` or, co-mounted with cpuacct, as `cpu,cpuacct` (with `cpu` a symlink).
CGROUP_V1_DIRS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))
# Usable CPUs per default instance, and the most instances of one Python model by default. Measured on the real
# server (docs/benchmarks.md): on 2 CPUs, 2, 4 and 8 instances each were below 1 at concurrency 64 in almost every
# run (4 / 4 was below 1 / 1 in seven of eight): the models' processes compete with the server, the engine and each
# other. So an instance per two CPUs,
# which still lets a 16-core node tokenize on several CPUs at once. Each instance is a process with its own tokenizer.
CPUS_PER_INSTANCE = 2
MAX_DEFAULT_INSTANCES = 8


def quota_cpus(
    cpu_max: str | None = None, cfs_quota_us: str | None = None, cfs_period_us: str | None = None
) -> float | None:
    """The CPU quota as a number of CPUs (1.5 for `150000 100000`), or None when there is no quota.

    `cpu_max` is the content of cgroup v2 `cpu.max` (`max 100000` means unlimited); the other two are v1's files
    (a quota of -1 means unlimited). v2 wins when both are given. Unreadable or malformed content counts as no quota:
    the affinity mask still bounds the count."""
    if cpu_max is not None:
        parts = cpu_max.split()
        if len(parts) >= 1 and parts[0] == "max":
            return None
        return _ratio(parts[0] if parts else "", parts[1] if len(parts) > 1 else "100000")
    if cfs_quota_us is not None and cfs_period_us is not None:
        return _ratio(cfs_quota_us.strip(), cfs_period_us.strip())
    return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:  # v1 writes -1 for "no limit"
        return None
    return quota_us / period_us


def usable_from(affinity: int, quota: float | None) -> int:
    """CPUs this process may use: the affinity mask's size, lowered by a quota (rounded up: 1.5 CPUs keep two
    threads busy part of the time, and a fractional quota never means zero)."""
    count = max(1, affinity)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return count


MAX_FRONT_WORKERS = 8
# One OpenAI front worker per 8 CPUs: a worker streaming many answers writes each burst of tokens in one system call,
# so fewer, busier workers stream more (16 CPUs, engine stand-in at ~40k tokens/s: 2 workers 31-32k tokens/s, 4
# workers 27k, 8 workers 22-27k; docs/benchmarks.md).
CPUS_PER_FRONT_WORKER = 8


def default_instances(cpus: int) -> int:
    """The default instance count of pre- and postprocessing on `cpus` usable CPUs."""
    return max(1, min(cpus // CPUS_PER_INSTANCE, MAX_DEFAULT_INSTANCES))


def default_front_workers(cpus: int) -> int:
    """The OpenAI front's default process count: one per CPUS_PER_FRONT_WORKER CPUs, at least 1, at most
    MAX_FRONT_WORKERS."""
    return max(1, min(cpus // CPUS_PER_FRONT_WORKER, MAX_FRONT_WORKERS))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """The CPUs this container may use, read from the cgroup files and the affinity mask."""
    v1 = next((d for d in CGROUP_V1_DIRS if (d / "cpu.cfs_quota_us").is_file()), CGROUP_V1_DIRS[0])
    quota = quota_cpus(_read(CGROUP_V2_CPU_MAX), _read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us"))
    return usable_from(_affinity(), quota)
