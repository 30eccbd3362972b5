"""The serving plot: unary throughput and p99 latency against concurrency, ours against the seeds' configuration.

matplotlib is an optional dependency (`pip install -e '.[bench]'`); without it the plot is skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.serving_bench import OURS, SEEDS, Result, summary

Series = dict[str, list[tuple[int, float, float]]]  # pipeline name -> [(concurrency, req/s, p99 ms)]
ENGINE_ALONE = "engine alone"


def unary_series(results: list[Result]) -> Series:
    """The unary ensemble loads of ours and the seeds' pipeline (engine delay 0), by rising concurrency."""
    series: Series = {}
    for r in results:
        if r.run.pipeline in (OURS, SEEDS) and r.load.kind == "unary" and r.run.token_delay_s == 0:
            numbers = summary(r.outcome)
            name = ENGINE_ALONE if r.load.model == "tensorrt_llm" else r.run.pipeline.name
            series.setdefault(name, []).append((r.load.concurrency, numbers["requests_per_s"], numbers["p99_ms"]))
    return {name: sorted(points) for name, points in series.items()}


def write_plot(series: Series, path: Path, subtitle: str) -> str | None:
    """Write the PNG; None when written, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    if not series:
        return "no unary results to plot"
    from trtllm_entrypoint.config import cpus

    usable = cpus.usable_cpus()
    count = cpus.default_instances(usable)
    styles = {
        OURS.name: (
            "tab:blue",
            "o",
            f"ours (defaults on {usable} CPUs: {count} instance{'s' if count > 1 else ''} each, no BLS)",
        ),
        SEEDS.name: ("tab:gray", "s", "seeds' configuration (1 instance each, BLS loaded)"),
        ENGINE_ALONE: ("tab:orange", "^", "the engine double alone, no pipeline (the ceiling)"),
    }
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    order = list(styles)
    for name, points in sorted(series.items(), key=lambda item: order.index(item[0]) if item[0] in order else 99):
        colour, marker, label = styles.get(name, (None, "x", name))
        concurrency = [p[0] for p in points]
        line = "--" if name == ENGINE_ALONE else "-"
        left.plot(concurrency, [p[1] for p in points], line, marker=marker, color=colour, label=label)
        right.plot(concurrency, [p[2] for p in points], line, marker=marker, color=colour, label=label)
    for axis, title, unit in ((left, "Throughput", "requests/s"), (right, "p99 latency", "ms")):
        axis.set_xscale("log", base=2)
        ticks = sorted({p[0] for points in series.values() for p in points})
        axis.set_xticks(ticks, [str(t) for t in ticks])
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
    left.legend(loc="lower right", fontsize=8)
    figure.suptitle(
        f"Unary generate through the ensemble, real tritonserver, engine double at 0 ms/token\n{subtitle}", fontsize=10
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return None
