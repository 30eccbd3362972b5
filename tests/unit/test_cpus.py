"""The CPUs a container may use (cgroup quota and affinity, from file contents) and the instance defaults."""

import pytest

from trtllm_entrypoint.config import cpus


@pytest.mark.parametrize(
    "cpu_max,v1_quota,v1_period,expected",
    [
        ("max 100000\n", None, None, None),  # cgroup v2, no limit (docker run without --cpus)
        ("200000 100000\n", None, None, 2.0),  # --cpus=2
        ("150000 100000\n", None, None, 1.5),  # --cpus=1.5
        ("50000 100000\n", None, None, 0.5),  # Kubernetes limits.cpu: 500m
        ("400000\n", None, None, 4.0),  # period left out: the kernel's default 100 ms
        (None, "-1\n", "100000\n", None),  # cgroup v1, no limit
        (None, "300000\n", "100000\n", 3.0),  # cgroup v1, --cpus=3
        (None, "100000\n", None, None),  # v1 period unreadable: no quota known
        ("max 100000\n", "300000", "100000", None),  # both mounted (hybrid): v2 decides
        ("garbage", None, None, None),  # malformed: no quota (the affinity still bounds)
        (None, "0", "100000", None),
        (None, None, None, None),  # no cgroup files at all (not Linux, or not mounted)
    ],
)
def test_quota_from_cgroup_files(cpu_max, v1_quota, v1_period, expected):
    assert cpus.quota_cpus(cpu_max, v1_quota, v1_period) == expected


@pytest.mark.parametrize(
    "affinity,quota,expected",
    [
        (64, None, 64),  # no quota: the affinity mask (--cpuset-cpus or the whole host)
        (64, 4.0, 4),  # a 4-CPU limit on a 64-core node: not os.cpu_count()
        (64, 1.5, 2),  # fractional quotas round up
        (64, 0.1, 1),  # never 0
        (2, 8.0, 2),  # a quota above the cpuset cannot add CPUs
        (0, None, 1),
    ],
)
def test_usable_cpus_are_the_smaller_of_affinity_and_quota(affinity, quota, expected):
    assert cpus.usable_from(affinity, quota) == expected


@pytest.mark.parametrize("usable,expected", [(1, 1), (2, 1), (3, 1), (4, 2), (16, 8), (64, 8)])
def test_default_instances_follow_the_cpus_up_to_a_cap(usable, expected):
    assert cpus.default_instances(usable) == expected


def test_usable_cpus_reads_the_cgroup_files(tmp_path, monkeypatch):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("300000 100000\n")
    monkeypatch.setattr(cpus, "CGROUP_V2_CPU_MAX", cpu_max)
    monkeypatch.setattr(cpus, "CGROUP_V1_DIRS", (tmp_path / "absent",))
    monkeypatch.setattr(cpus, "_affinity", lambda: 64)
    assert cpus.usable_cpus() == 3
    cpu_max.unlink()
    v1 = tmp_path / "cpu,cpuacct"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    monkeypatch.setattr(cpus, "CGROUP_V1_DIRS", (tmp_path / "cpu", v1))
    assert cpus.usable_cpus() == 1
