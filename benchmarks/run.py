"""`python -m benchmarks` (or `python benchmarks/run.py`): start-up overhead, cache reuse, image builds, static checks,
and the serving pipeline on the real tritonserver.

Prints a table (metric | value | target | status) and writes the results as JSON. Exit 0 when every target is met,
1 when one is missed. Progress goes to stderr; docs/benchmarks.md explains each measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `benchmarks.`, `harness.` and `trtllm_images.` importable
    sys.path.insert(0, str(REPO))

from benchmarks import entrypoint_bench, image_bench, static_bench  # noqa: E402
from benchmarks.report import Metric, document, markdown_table, table  # noqa: E402
from benchmarks.sandbox import Sandbox  # noqa: E402

SUITES = ("warm", "cold", "concurrent", "images", "static", "serving", "scaling", "openai")
# Runs per measurement (medians are taken over them): full, and --quick.
REPEATS = {
    "warm": (20, 5),  # per checkpoint size
    "cold": (5, 2),
    "concurrent": (3, 1),  # each run starts 8 replicas
    "images": (3, 1),  # each run: a fresh base, a first build, an edited rebuild
    "static": (5, 2),
    "serving": (5, 2),  # warm starts to ready, each of `serve` and of tritonserver alone, per BLS variant
    "scaling": (1, 1),  # one sweep of the autoscaling signal over the concurrencies
    "openai": (3, 1),  # alternating rounds of generate_stream and the OpenAI frontend
}
# Seconds each serving load is measured (after a warm-up of a fifth of it): full, and --quick.
SERVING_SECONDS = (5.0, 2.0)
DEFAULT_JSON = REPO / "out" / "benchmarks.json"  # out/ is not tracked; --record keeps a run in RESULTS_DIR
RESULTS_DIR = REPO / "benchmarks" / "results"  # one file per run, committed; docs/benchmarks.md shows the latest
DEFAULT_PLOT = REPO / "out" / "serving-throughput.png"  # docs/serving-throughput.png is the committed one
DEFAULT_OPENAI_PLOT = REPO / "out" / "openai-vs-generate-stream.png"  # docs/ keeps the committed one
DEFAULT_PROFILE = REPO / "out" / "openai-frontend-profile.txt"  # written only when an openai target is missed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (see REPEATS in benchmarks/run.py)")
    parser.add_argument(
        "--only",
        action="append",
        choices=SUITES,
        metavar="SUITE",
        help=f"run only this suite (repeatable): {', '.join(SUITES)}; concurrent also runs cold",
    )
    parser.add_argument(
        "--no-ready",
        action="store_true",
        help="serving: leave out the warm starts to ready (the lent machine's run, which records throughput)",
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/benchmarks.md)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write the results [{DEFAULT_JSON}]")
    parser.add_argument(
        "--record",
        action="store_true",
        help="also keep the results as benchmarks/results/<date>-<time>-<suites>.json, one file per run, to commit",
    )
    parser.add_argument(
        "--build-sleep",
        type=float,
        default=entrypoint_bench.BUILD_SLEEP_S,
        metavar="SECONDS",
        help="how long the trtllm-build double takes in cold and concurrent starts "
        f"[{entrypoint_bench.BUILD_SLEEP_S:g}]",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=DEFAULT_PLOT,
        help=f"where the serving suite writes its throughput plot [{DEFAULT_PLOT}]",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="parent of the scratch directory (default: the temp dir); "
        "needs sparse-file support for the 21 GB checkpoint",
    )
    return parser.parse_args(argv)


def selected_suites(only: list[str] | None) -> list[str]:
    chosen = set(only or SUITES)
    if "concurrent" in chosen:
        chosen.add("cold")  # the concurrent start is compared with a single cold start
    return [suite for suite in SUITES if suite in chosen]


def skipped(suite: str, reason: str) -> Metric:
    return Metric(f"{suite}: skipped", None, note=reason)


def run_entrypoint_suites(
    suites: list[str], repeats: dict[str, int], build_sleep_s: float, work: Path, say
) -> list[Metric]:
    from harness.build_standin import TemplatesMissing

    wanted = [s for s in ("warm", "cold", "concurrent") if s in suites]
    if not wanted:
        return []
    try:
        sandbox = Sandbox(work / "sandbox")
    except TemplatesMissing as exc:
        say(f"entrypoint benchmarks skipped: {exc}")
        return [skipped(s, str(exc)) for s in wanted]
    metrics = []
    if "warm" in suites:
        metrics += entrypoint_bench.warm_start(sandbox, work, repeats["warm"], say)
    if "cold" in suites:
        cold, single_cold_s = entrypoint_bench.cold_start(sandbox, work, repeats["cold"], build_sleep_s, say)
        metrics += cold
        if "concurrent" in suites:
            metrics += entrypoint_bench.concurrent_start(
                sandbox, work, repeats["concurrent"], build_sleep_s, single_cold_s, say
            )
    return metrics


def run_image_suite(repeats: int, work: Path, say) -> tuple[list[Metric], str | None]:
    """The image metrics and the Docker server version (None without Docker)."""
    client, reason = image_bench.docker_or_reason()
    if client is None:
        say(f"image benchmarks skipped: {reason}")
        return [skipped("images", reason)], None
    version = client.version().get("Version")
    standin, reason = image_bench.standin_or_reason(client, say)
    if standin is None:
        say(f"image benchmarks skipped: {reason}")
        return [skipped("images", reason)], version
    return image_bench.image_metrics(client, standin, work / "images", repeats, say), version


def run_serving_suite(repeats: int, measure_s: float, work: Path, plot_path: Path, say) -> list[Metric]:
    """The serving metrics, and the plot written to plot_path; skipped with the reason when the real server, the
    templates or tritonclient are missing here."""
    from harness import realtriton
    from harness.build_standin import TemplatesMissing

    try:
        from benchmarks import plot, serving_bench

        outcome = serving_bench.serving_metrics(work, repeats, measure_s / 5, measure_s, say)
    except (ImportError, realtriton.RealTritonUnavailable, TemplatesMissing) as exc:
        say(f"serving benchmarks skipped: {exc}")
        return [skipped("serving", str(exc))]
    info = machine(None)
    subtitle = f"{info['nproc']} CPUs ({info['cpu_model']}), load generator on the same CPUs, {measure_s:g} s per point"
    reason = plot.write_plot(plot.unary_series(outcome.results), plot_path, subtitle)
    say(f"plot: {reason}" if reason else f"plot written to {plot_path}")
    return outcome.metrics


def run_scaling_suite(measure_s: float, work: Path, say) -> list[Metric]:
    """The autoscaling signal against offered load on the real server; skipped when it cannot run here."""
    from benchmarks import scaling_signal
    from harness import realtriton
    from harness.build_standin import TemplatesMissing

    try:
        steps = scaling_signal.sweep(work / "scaling", measure_s, say)
    except (realtriton.RealTritonUnavailable, TemplatesMissing) as exc:
        say(f"scaling benchmark skipped: {exc}")
        return [skipped("scaling", str(exc))]
    say("scaling signal table (docs/benchmarks.md):\n" + scaling_signal.markdown(steps))
    return scaling_signal.metrics(steps)


def run_openai_suite(rounds: int, measure_s: float, work: Path, say) -> list[Metric]:
    """Our OpenAI front against generate_stream and the engine alone (side by side, both workflows); a profile of the
    front when a target is missed; skipped when the real server or the front cannot run here."""
    from benchmarks import openai_bench
    from harness import realtriton
    from harness.build_standin import TemplatesMissing

    try:
        measured = openai_bench.measure(
            work / "openai", measure_s / 5, measure_s, rounds, say, workflows=tuple(openai_bench.WORKFLOW_TAGS)
        )
        metrics = openai_bench.metrics(measured)
        say("openai table (docs/benchmarks.md):\n" + openai_bench.table(metrics))
        info = machine(None)
        subtitle = f"{info['nproc']} CPUs, load average {info['load_average_at_end'][0]:.1f}, {measure_s:g} s per point"
        reason = openai_bench.write_plot(metrics, DEFAULT_OPENAI_PLOT, subtitle)
        say(f"plot: {reason}" if reason else f"plot written to {DEFAULT_OPENAI_PLOT}")
        if any(m.status == "fail" for m in metrics):
            say("a target is missed: " + openai_bench.profile(work / "openai-profile", measure_s, DEFAULT_PROFILE, say))
    except (realtriton.RealTritonUnavailable, TemplatesMissing) as exc:
        say(f"openai benchmark skipped: {exc}")
        return [skipped("openai", str(exc))]
    return metrics


def machine(docker_version: str | None) -> dict:
    return {
        "nproc": os.cpu_count(),
        "memory_bytes": _meminfo_total(),
        "cpu_model": _cpu_model(),
        "docker_version": docker_version or _docker_cli_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_end": list(os.getloadavg()),
    }


def _meminfo_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _docker_cli_version() -> str | None:
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def record_path(suites: list[str], now: datetime.datetime) -> Path:
    """Where --record keeps a run: named by its UTC start and its suites ("all" for every one)."""
    name = "all" if set(suites) == set(SUITES) else "+".join(suites)
    return RESULTS_DIR / f"{now:%Y-%m-%d-%H%M}-{name}.json"


def write_json(path: Path, data: dict) -> None:
    """Atomically: an interrupted run never leaves a truncated results file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the servers and scratch directories are cleaned up by their finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    suites = selected_suites(args.only)
    started = datetime.datetime.now(datetime.timezone.utc)
    repeats = {suite: full_quick[1 if args.quick else 0] for suite, full_quick in REPEATS.items()}

    def say(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    metrics: list[Metric] = []
    docker_version = None
    with tempfile.TemporaryDirectory(prefix="trtllm-bench-", dir=args.workdir) as tmp:
        work = Path(tmp)
        metrics += run_entrypoint_suites(suites, repeats, args.build_sleep, work, say)
        if "images" in suites:
            image_metrics, docker_version = run_image_suite(repeats["images"], work, say)
            metrics += image_metrics
        if "static" in suites:
            metrics += static_bench.static_metrics(repeats["static"], say)
        if "serving" in suites:
            metrics += run_serving_suite(
                0 if args.no_ready else repeats["serving"],
                SERVING_SECONDS[1 if args.quick else 0],
                work,
                args.plot,
                say,
            )
        if "scaling" in suites:
            metrics += run_scaling_suite(SERVING_SECONDS[1 if args.quick else 0], work, say)
        if "openai" in suites:
            metrics += run_openai_suite(repeats["openai"], SERVING_SECONDS[1 if args.quick else 0], work, say)
    settings = {
        "suites": suites,
        "quick": args.quick,
        "repeats": {s: repeats[s] for s in suites},
        "build_double_sleep_s": args.build_sleep,
        "replicas": entrypoint_bench.REPLICAS,
        "small_checkpoint_bytes": entrypoint_bench.SMALL_BYTES,
        "large_checkpoint_bytes": entrypoint_bench.LARGE_BYTES,
        "serving_seconds_per_load": SERVING_SECONDS[1 if args.quick else 0],
    }
    result = document(metrics, machine(docker_version), settings)
    write_json(args.json, result)
    print(markdown_table(metrics) if args.markdown else table(metrics))
    say(f"results written to {args.json}")
    if args.record:
        kept = record_path(suites, started)
        write_json(kept, {"started_utc": started.isoformat(timespec="seconds"), **result})
        say(f"run kept as {kept.relative_to(REPO)}: commit it, and refresh docs/benchmarks.md from it")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
