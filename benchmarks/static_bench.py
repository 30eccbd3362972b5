"""`build.py render --all --print` and `check --all` as users run them, and where the time goes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import Metric, Target, median
from trtllm_images import checks, render
from trtllm_images import matrix as matrix_mod
from trtllm_images.plan import make_build_plan

REPO = Path(__file__).resolve().parents[1]
RENDER_ARGV = ("render", "--all", "--print")
CHECK_ARGV = ("check", "--all")

Say = Callable[[str], None]


def _time_cli(args: tuple[str, ...]) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "build.py"), *args], cwd=REPO, capture_output=True, text=True)
    seconds = time.monotonic() - started
    # `check` exits 1 when it finds errors; that is still a complete run. Anything else means it did not run.
    if done.returncode not in (0, 1) or not done.stdout:
        raise RuntimeError(f"build.py {' '.join(args)} exited {done.returncode}: {done.stderr[-1000:]}")
    return seconds


def _timed(func: Callable[[], object]) -> float:
    started = time.monotonic()
    func()
    return time.monotonic() - started


def static_metrics(repeats: int, say: Say) -> list[Metric]:
    matrix = matrix_mod.load()
    plans = {entry.tag: make_build_plan(entry, out_dir=Path("out")) for entry in matrix.supported()}
    rendered = {tag: render.render_dockerfiles(plan) for tag, plan in plans.items()}
    texts = [(tag, name, text) for tag, files in rendered.items() for name, text in sorted(files.items())]
    say(f"render + check over {len(plans)} tags ({len(texts)} Dockerfiles): {repeats} runs")
    cli_render, cli_check, in_render, in_policy, in_hadolint = [], [], [], [], []
    for _ in range(repeats):
        cli_render.append(_time_cli(RENDER_ARGV))
        cli_check.append(_time_cli(CHECK_ARGV))
        in_render.append(_timed(lambda: [render.render_dockerfiles(plan) for plan in plans.values()]))
        in_policy.append(
            _timed(lambda: [checks.dockerfile_findings(*t) for t in texts] + [checks.matrix_findings(matrix)])
        )
        in_hadolint.append(_timed(lambda: checks.hadolint_findings(texts)))
    total = [r + c for r, c in zip(cli_render, cli_check, strict=True)]
    return [
        Metric(
            "render --all + check --all (CLI)",
            median(total),
            "s",
            Target("<", 2.0, "s"),
            details={"samples_s": total, "repeats": repeats, "tags": len(plans), "dockerfiles": len(texts)},
        ),
        Metric("  render --all --print (CLI)", median(cli_render), "s", details={"samples_s": cli_render}),
        Metric("  check --all (CLI)", median(cli_check), "s", details={"samples_s": cli_check}),
        Metric("  in-process: render all tags", median(in_render), "s"),
        Metric("  in-process: matrix + Dockerfile policy checks", median(in_policy), "s"),
        Metric(f"  in-process: hadolint, one process for all {len(texts)} files", median(in_hadolint), "s"),
    ]
