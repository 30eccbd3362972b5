"""The OpenAI-vs-generate_stream comparison's pure part: which rows, targets and verdicts come from measured runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import openai_bench as ob
from benchmarks import serving_bench
from benchmarks.serving_stats import StreamRun


def run(concurrency: int, gap_s: float, tokens: int = 8, requests: int = 10, seconds: float = 1.0) -> StreamRun:
    arrivals = tuple(tuple(r + 0.05 + i * gap_s for i in range(tokens)) for r in range(requests))
    return StreamRun(concurrency, seconds, tuple(float(r) for r in range(requests)), arrivals)


def measured(openai_gap_s: float, openai_seconds: float = 1.0, openai_server_cpu_s: float = 0.4) -> dict:
    runs, cpu = {}, {}
    for c in ob.CONCURRENCY:
        runs[(ob.TRITON.name, c)] = [run(c, 0.010)]
        runs[(ob.OPENAI.name, c)] = [run(c, openai_gap_s, seconds=openai_seconds)]
        cpu[(ob.TRITON.name, c)] = [ob.CpuUse(0.2, 0.1)]
        cpu[(ob.OPENAI.name, c)] = [ob.CpuUse(openai_server_cpu_s, 0.1)]
    return {"runs": runs, "cpu": cpu, "ready": {"openai": [2.0, 2.2, 2.1]}}


def by_name(metrics):
    return {m.name: m for m in metrics}


def test_the_c16_rows_are_the_targets_and_pass_when_the_frontend_adds_little():
    rows = by_name(ob.metrics(measured(0.0105)))
    added = rows["openai vs generate_stream c=16: p50 ITL added"]
    assert added.value == pytest.approx(0.5) and added.status == "pass"
    assert rows["openai vs generate_stream c=16: tokens/s ratio"].status == "pass"
    assert rows["openai vs generate_stream c=1: p50 ITL added"].status == "info"  # c=1: information only
    assert rows["time to ready: tritonserver and the OpenAI front (its /health/ready)"].value == 2.1


def test_a_slower_frontend_fails_both_targets():
    rows = by_name(ob.metrics(measured(0.012, openai_seconds=1.25)))
    assert rows["openai vs generate_stream c=16: p50 ITL added"].status == "fail"
    assert rows["openai vs generate_stream c=16: tokens/s ratio"].value == pytest.approx(0.8)
    assert rows["openai vs generate_stream c=16: tokens/s ratio"].status == "fail"


def test_only_events_with_text_count_as_tokens():
    assert ob.OPENAI.token_of({"choices": [{"text": "a"}]}) and not ob.OPENAI.token_of({"choices": [{"text": ""}]})
    assert ob.TRITON.token_of({"text_output": "a"}) and not ob.TRITON.token_of({"text_output": ""})


def test_cpu_per_token_is_the_windows_cpu_over_the_tokens_streamed():
    rows = by_name(ob.metrics(measured(0.010, openai_server_cpu_s=0.8)))
    row = rows["openai vs generate_stream c=16: server CPU per token"]
    # 10 requests x 8 tokens in the window: 0.8 s / 80 tokens, against 0.2 s / 80 for generate_stream.
    assert row.value == pytest.approx(10.0) and row.status == "info"
    assert "vs 2.50 ms" in row.note and "CPUs busy (server + load) 0.90 vs 0.30" in row.note


@pytest.fixture
def process_group():
    """A process group as start_server makes one: a leader and a child burning CPU."""
    burn = "import os, time\nos.fork()\nend = time.time() + 60\nwhile time.time() < end: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", burn], start_new_session=True)
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.process
def test_group_cpu_counts_every_live_process_of_the_group(process_group):
    time.sleep(0.5)
    before = serving_bench.group_cpu_s(process_group.pid)
    time.sleep(1.0)
    used = serving_bench.group_cpu_s(process_group.pid) - before
    # Two busy processes (the leader and its fork) on a machine of at least 2 CPUs: well over one CPU-second
    # unless the machine is loaded; one process alone could never pass 1.0.
    assert used > 1.05 if (os.cpu_count() or 1) >= 2 and os.getloadavg()[0] < 1 else used > 0.3
    assert serving_bench.group_cpu_s(os.getpid() + 10**7) == 0.0  # no such group


@pytest.mark.process
def test_roles_name_the_supervisor_and_each_stub_by_its_model(tmp_path):
    stub = tmp_path / "triton_python_backend_stub"
    stub.write_text("#!/bin/sh\nsleep 30\n")  # no exec: the shell keeps the stub's command line
    stub.chmod(0o755)
    model = tmp_path / "repo" / "postprocessing" / "1" / "model.py"
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, time\nsubprocess.Popen([{str(stub)!r}, {str(model)!r}])\ntime.sleep(30)",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while "stub postprocessing" not in (roles := ob.process_roles(leader.pid)).values():
            assert time.monotonic() < deadline, roles
            time.sleep(0.05)
        assert roles[leader.pid] == "supervisor"
        assert os.getpid() not in roles  # another process group
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def speedscope(frames: list[str], profiles: dict[str, list[list[int]]]) -> dict:
    return {
        "shared": {"frames": [{"name": n, "file": "/lib/x.so", "line": 0} for n in frames]},
        "profiles": [{"name": name, "samples": samples} for name, samples in profiles.items()],
    }


def test_the_summary_ranks_threads_and_names_what_a_waiting_leaf_waits_for():
    frames = ["thread (7)", "Send", "pybind11::gil_scoped_acquire", "0x7f00", "epoll_wait", "send"]
    doc = speedscope(
        frames,
        {
            'Process 10 Thread 7 ""': [[0, 1, 2, 3]] * 30 + [[0, 1]] * 10,
            'Process 10 Thread 10 "MainThread"': [[4]] * 5 + [[5]] * 15,
            'Process 11 Thread 11 "MainThread"': [[4]],
        },
    )
    text = ob.summarise(doc, {10: "frontend", 11: "stub postprocessing"}, rate_hz=50)
    table = text.split("\n\n")[0].splitlines()
    assert table[1].split()[:2] == ["frontend", "7"] and table[1].endswith("0.80  65.6%")
    assert table[3].startswith("stub postprocessing")
    # The unnamed libc address is shown through its callers: waiting for the GIL inside Send.
    assert "75.0%  pybind11::gil_scoped_acquire (x.so) < Send (x.so)" in text
    assert "75.0%  send (x.so)" in text
    assert "== stub postprocessing" not in text  # under 5% of the samples: in the table only
    assert "thread (7)" not in text.split("== frontend, thread 7")[1]  # py-spy's root frames are not listed
