"""Start-up of the container entrypoint with the NVIDIA doubles: warm start, cold start by phase, concurrent starts."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import Metric, Target, median
from benchmarks.sandbox import Sandbox, Start, checkpoint_bytes, sized_checkpoint
from harness.doubles import read_records

SMALL_BYTES = 100 * 10**6
LARGE_BYTES = 20 * 2**30  # 21.5 GB, sparse
LARGE_SHARDS = 5
BUILD_SLEEP_S = 2.0  # TRTLLM_BUILD_DOUBLE_SLEEP: the build dominates a cold start, as a real one does
REPLICAS = 8
# Programs that a cold start of a local checkpoint runs exactly once.
ONCE_PROGRAMS = ("convert_checkpoint", "trtllm-build", "tritonserver")
ONCE_PHASES = ("resolve", "engine", "engine build", "fill")
# Breakdown rows: (row name, `phase done` phase or `step done` step). "engine" includes convert, build and publish.
_PHASES = (
    ("resolve", "resolve"),
    ("download", "download"),
    ("convert", "convert"),
    ("build", "trtllm-build"),
    ("engine", "engine"),
    ("fill", "fill"),
)
_DURATION_EVENTS = {"phase done": "phase", "step done": "step"}

Say = Callable[[str], None]


def phase_seconds(events: list[dict]) -> dict[str, list[float]]:
    """Durations of each `phase done` (by phase) and `step done` (by step) event."""
    found: dict[str, list[float]] = {}
    for event in events:
        field = _DURATION_EVENTS.get(event.get("msg"))
        if field and field in event:
            found.setdefault(event[field], []).append(float(event["seconds"]))
    return found


def event_time(events: list[dict], msg: str) -> float | None:
    return next((float(e["ts"]) for e in events if e.get("msg") == msg), None)


def breakdown(start: Start) -> dict[str, float]:
    """One start as phases, in order; the log's timestamps have millisecond resolution."""
    phases = phase_seconds(start.events)
    exec_at = event_time(start.events, "starting the server")
    # Interpreter start, imports and settings: until the entrypoint's first log line.
    row = {"until first log": start.events[0]["ts"] - start.started if start.events else float("nan")}
    row.update({name: sum(phases.get(key, [0.0])) for name, key in _PHASES})
    # From the entrypoint's last log line before exec to the server double's first record.
    row["launch"] = start.server_time - exec_at if exec_at is not None else float("nan")
    row["total"] = start.seconds
    row["overhead"] = row["total"] - row["convert"] - row["build"]
    return row


def once_counts(start: Start, records: Path) -> dict[str, int]:
    counts = {p: len(read_records(records, p)) for p in ONCE_PROGRAMS}
    phases = phase_seconds(start.events)
    counts.update({f"phase {p}": len(phases.get(p, [])) for p in ONCE_PHASES})
    return counts


def warm_start(sandbox: Sandbox, work: Path, repeats: int, say: Say) -> list[Metric]:
    """`serve` with the engine (and repository) already in the cache, small vs large checkpoint.

    Runs alternate small/large, so that load from anything else on the machine affects both sizes alike.
    """
    runs = {}
    for label, size, shards in (("small", SMALL_BYTES, 1), ("large", LARGE_BYTES, LARGE_SHARDS)):
        model = sized_checkpoint(work / f"model-{label}", size, shards)
        env = sandbox.env(model, work / f"cache-warm-{label}", work / f"records-warm-{label}")
        sandbox.prepare(env)  # the one cold start that fills the cache
        runs[label] = (model, env, len(read_records(Path(env["DOUBLE_RECORD_DIR"]), "trtllm-build")))
    say(f"warm start: {repeats} runs per checkpoint size")
    starts: dict[str, list[Start]] = {label: [] for label in runs}
    for _ in range(repeats):
        for label, (_, env, _) in runs.items():
            starts[label].append(sandbox.serve(env))
    samples = {label: [start.seconds for start in runs_of] for label, runs_of in starts.items()}
    metrics = []
    for label, (model, env, builds_before) in runs.items():
        rows = [breakdown(start) for start in starts[label]]
        rebuilt = len(read_records(Path(env["DOUBLE_RECORD_DIR"]), "trtllm-build")) - builds_before
        size = checkpoint_bytes(model)
        metrics.append(
            Metric(
                f"warm start, {label} checkpoint ({size / 1e9:.1f} GB)",
                median(samples[label]),
                "s",
                Target("<", 1.0, "s"),
                note="" if rebuilt == 0 else f"{rebuilt} unexpected engine build(s) in warm runs",
                details={
                    "samples_s": samples[label],
                    "repeats": repeats,
                    "checkpoint_bytes": size,
                    "engine_builds_during_runs": rebuilt,
                    "phases_median_s": {name: median([row[name] for row in rows]) for name in rows[0]},
                },
            )
        )
    ratio = median(samples["large"]) / median(samples["small"])
    metrics.append(Metric("warm start, large/small", ratio, "x", Target("<=", 1.2, "x")))
    return metrics


def cold_start(
    sandbox: Sandbox, work: Path, repeats: int, build_sleep_s: float, say: Say
) -> tuple[list[Metric], float]:
    """`serve` on an empty cache, phase by phase; returns the metrics and the median total (for concurrency)."""
    model = sized_checkpoint(work / "model-cold", SMALL_BYTES, 1)
    say(f"cold start: {repeats} runs (trtllm-build double sleeps {build_sleep_s:g} s)")
    rows, counts = [], []
    for run in range(repeats):
        cache, records = work / f"cache-cold-{run}", work / f"records-cold-{run}"
        start = sandbox.serve(sandbox.env(model, cache, records, TRTLLM_BUILD_DOUBLE_SLEEP=str(build_sleep_s)))
        rows.append(breakdown(start))
        counts.append(once_counts(start, records))
    phases = {name: median([row[name] for row in rows]) for name in rows[0]}
    notes = {
        "total": f"median of {repeats} runs, trtllm-build double sleeping {build_sleep_s:g} s",
        "download": "skipped: local checkpoint, nothing to download",
        "overhead": "total minus convert and build: what the entrypoint itself adds",
    }
    metrics = [
        Metric(
            f"cold start: {name}",
            phases[name],
            "s",
            note=notes.get(name, ""),
            details={"samples_s": [row[name] for row in rows]},
        )
        for name in ("total", *(n for n in phases if n != "total"))
    ]
    not_once = sum(1 for run in counts for count in run.values() if count != 1)
    metrics.append(
        Metric(
            "cold start: steps not run exactly once", not_once, "", Target("==", 0), details={"counts_per_run": counts}
        )
    )
    return metrics, phases["total"]


def concurrent_start(
    sandbox: Sandbox, work: Path, repeats: int, build_sleep_s: float, single_cold_s: float, say: Say
) -> list[Metric]:
    """Eight `serve` replicas on one empty cache: one build, and the last ready soon after a single cold start."""
    model = sized_checkpoint(work / "model-concurrent", SMALL_BYTES, 1)
    say(f"{REPLICAS} concurrent starts: {repeats} runs")
    builds, last_ready, cpu = [], [], []
    for run in range(repeats):
        cache, records = work / f"cache-concurrent-{run}", work / f"records-concurrent-{run}"
        envs = [
            sandbox.env(model, cache, records, TRTLLM_BUILD_DOUBLE_SLEEP=str(build_sleep_s)) for _ in range(REPLICAS)
        ]
        cpu_before = children_cpu_s()
        starts = sandbox.serve_many(envs)
        cpu.append((children_cpu_s() - cpu_before) / REPLICAS)
        builds.append(len(read_records(records, "trtllm-build")))
        last_ready.append(max(s.server_time for s in starts) - min(s.started for s in starts))
    cores = os.cpu_count() or 1
    # Each replica's start-up CPU work queues behind the others' when replicas outnumber cores.
    queued = median(cpu) * (REPLICAS - 1) / cores
    return [
        Metric(
            f"{REPLICAS} concurrent starts: engine builds",
            max(builds),
            "",
            Target("==", 1),
            details={"builds_per_run": builds},
        ),
        Metric(
            f"{REPLICAS} concurrent starts: last ready",
            median(last_ready),
            "s",
            details={"samples_s": last_ready, "repeats": repeats},
        ),
        Metric(
            f"{REPLICAS} concurrent starts: CPU time per replica",
            median(cpu),
            "s",
            note=f"{REPLICAS} replicas on {cores} core(s): ~{queued:.2f} s of the others' CPU work queues "
            "ahead of the last one",
            details={"samples_s": cpu},
        ),
        Metric(
            f"{REPLICAS} concurrent starts: last ready / single cold",
            median(last_ready) / single_cold_s,
            "x",
            Target("<=", 1.3, "x"),
        ),
    ]


def children_cpu_s() -> float:
    """User + system CPU seconds of every finished child process (and their waited-for descendants)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
