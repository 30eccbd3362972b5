"""The OpenAI-vs-generate_stream comparison's pure part: which rows, targets and verdicts come from measured runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import openai_bench as ob
from benchmarks import serving_bench, stream_client
from benchmarks.serving_stats import StreamRun


def run(concurrency: int, gap_s: float, tokens: int = 8, requests: int = 10, seconds: float = 1.0) -> StreamRun:
    arrivals = tuple(tuple(r + 0.05 + i * gap_s for i in range(tokens)) for r in range(requests))
    return StreamRun(concurrency, seconds, tuple(float(r) for r in range(requests)), arrivals)


def measured(
    openai_gap_s: float,
    openai_seconds: float = 1.0,
    openai_server_cpu_s: float = 0.4,
    usable_cpus: int = 2,
    engine_seconds: float = 0.5,
) -> dict:
    """The engine workflow's three APIs at each concurrency of a machine: generate_stream 10 ms between tokens, the
    engine alone as fast over `engine_seconds`, ours `openai_gap_s` apart over `openai_seconds`."""
    runs, cpu = {}, {}
    for c in ob.concurrencies(usable_cpus):
        for api, r, used in (
            ("generate_stream", run(c, 0.010), ob.CpuUse(0.2, 0.1)),
            ("openai", run(c, openai_gap_s, seconds=openai_seconds), ob.CpuUse(openai_server_cpu_s, 0.1, 0.16)),
            ("engine alone", run(c, 0.010, seconds=engine_seconds), ob.CpuUse(0.1, 0.1)),
        ):
            runs[("engine", api, c)] = [r]
            cpu[("engine", api, c)] = [used]
    return {"runs": runs, "cpu": cpu, "ready": {"engine": [2.0, 2.2, 2.1]}, "workers": 2, "usable_cpus": usable_cpus}


def by_name(metrics):
    return {m.name: m for m in metrics}


def test_the_c16_rows_are_the_targets_on_2_cpus_and_pass_when_the_front_adds_little():
    rows = by_name(ob.metrics(measured(0.0105, openai_seconds=0.6)))
    added = rows["openai (engine) c=16: p50 ITL added over generate_stream"]
    assert added.value == pytest.approx(0.5) and added.status == "pass"
    ratio = rows["openai (engine) c=16: tokens/s over generate_stream"]
    assert ratio.value == pytest.approx(1 / 0.6) and ratio.status == "pass"
    assert rows["openai (engine) c=64: p50 ITL added over generate_stream"].status == "info"  # not a target's c
    assert rows["openai (engine) c=16: tokens/s over the engine alone"].status == "info"  # no such target on 2 CPUs
    assert rows["time to ready (engine): tritonserver and the OpenAI front (its /health/ready)"].value == 2.1


def test_from_16_cpus_every_concurrency_holds_the_targets_against_both_apis():
    assert ob.concurrencies(2) == ob.SMALL_CONCURRENCY and ob.concurrencies(16) == ob.LARGE_CONCURRENCY
    rows = by_name(ob.metrics(measured(0.01005, openai_seconds=0.5, usable_cpus=16, engine_seconds=0.45)))
    for c in ob.LARGE_CONCURRENCY:
        assert rows[f"openai (engine) c={c}: tokens/s over generate_stream"].status == "pass"  # 2.0x
        over_engine = rows[f"openai (engine) c={c}: tokens/s over the engine alone"]
        assert over_engine.value == pytest.approx(0.9) and over_engine.status == "pass"
        assert rows[f"openai (engine) c={c}: p50 ITL added over generate_stream"].status == "pass"  # +0.05 ms


def test_a_slower_front_fails_the_targets():
    rows = by_name(ob.metrics(measured(0.012, openai_seconds=1.25)))
    assert rows["openai (engine) c=16: p50 ITL added over generate_stream"].status == "fail"
    ratio = rows["openai (engine) c=16: tokens/s over generate_stream"]
    assert ratio.value == pytest.approx(0.8) and ratio.status == "fail"
    rows = by_name(ob.metrics(measured(0.010, openai_seconds=0.5, usable_cpus=16, engine_seconds=0.35)))
    assert rows["openai (engine) c=64: tokens/s over the engine alone"].status == "fail"  # 0.7x


def test_only_events_with_text_count_as_tokens():
    assert stream_client.token_of({"choices": [{"text": "a"}]}, "choices")
    assert not stream_client.token_of({"choices": [{"text": ""}]}, "choices")
    assert stream_client.token_of({"text_output": "a"}, "text_output")
    assert not stream_client.token_of({"text_output": ""}, "text_output")
    assert stream_client.token_of({"output_ids": 7}, "output_ids")


def test_cpu_per_token_is_the_windows_cpu_over_the_tokens_streamed_and_the_fronts_own_is_reported():
    rows = by_name(ob.metrics(measured(0.010, openai_server_cpu_s=0.8)))
    row = rows["openai (engine) c=16: server CPU per token"]
    # 10 requests x 8 tokens in the window: 0.8 s / 80 tokens, against 0.2 s / 80 for generate_stream.
    assert row.value == pytest.approx(10.0) and row.status == "info"
    assert "vs 2.500 ms" in row.note and "CPUs busy (server + load) 0.90 vs 0.30" in row.note
    assert rows["openai (engine) c=16: the front's own CPU per token"].value == pytest.approx(2.0)  # 0.16 s / 80
    assert "| engine | 16 | openai | 80 | 10.000 / 10.000 | 50.00 | 10.000 (2.000) |" in ob.table(list(rows.values()))


def test_the_stand_in_runs_as_several_stub_processes_in_a_copy_of_the_repository(tmp_path):
    repo = tmp_path / "cache" / "repo"
    (repo / "tensorrt_llm").mkdir(parents=True)
    config = repo / "tensorrt_llm" / "config.pbtxt"
    config.write_text('name: "tensorrt_llm"\ninstance_group [\n  {\n    count: 1\n    kind : KIND_CPU\n  }\n]\n')
    config.chmod(0o444)
    prepared = {"argv": ["tritonserver", f"--model-repository={repo}", "--http-port=8000"], "front": {}}
    out = ob.standin_instances(prepared, tmp_path / "work", 4)
    copy = tmp_path / "work" / "standin-repository"
    assert out["argv"] == ["tritonserver", f"--model-repository={copy}", "--http-port=8000"]
    assert "count: 4" in (copy / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "count: 1" in config.read_text()  # the cache as prepare made it
    config.chmod(0o644)
    config.write_text('name: "tensorrt_llm"\n')
    with pytest.raises(RuntimeError, match="instance_group"):
        ob.standin_instances(prepared, tmp_path / "work", 4)


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
