"""The server image with a real Docker engine: what it adds to its base, and what a one-line entrypoint edit rebuilds.

Drives the same functions as `python build.py` (plan, render, wheel, context, builder) on the stand-in NGC base for
25.01. The edit is made in a temp copy of entrypoints/, never in the repository.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import Metric, Target, median
from trtllm_entrypoint.errors import Error
from trtllm_images import builder, context, model_support, pipeline, render, wheel
from trtllm_images import matrix as matrix_mod
from trtllm_images.plan import make_build_plan

TAG = "25.01"
REGISTRY = "trtllm-bench"  # our own image names: never retag what the tests or users build
BASE_REF = f"{REGISTRY}/base:{TAG}"
EDITED_FILE = Path("trtllm_entrypoint") / "main.py"
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")

Say = Callable[[str], None]


@dataclass(frozen=True)
class Step:
    instruction: str
    cached: bool


def build_steps(lines: list[str]) -> list[Step]:
    """The classic builder's `Step i/n : INSTRUCTION` blocks, each cached when its block says `Using cache`."""
    steps: list[Step] = []
    for line in lines:
        match = _STEP.match(line.strip())
        if match:
            steps.append(Step(match.group(3), False))
        elif steps and "Using cache" in line:
            steps[-1] = Step(steps[-1].instruction, True)
    return steps


def layer_steps(steps: list[Step]) -> list[Step]:
    """Steps after FROM: ARG/FROM never report a cache hit, so they are left out of the hit count."""
    start = next((i + 1 for i, s in enumerate(steps) if s.instruction.upper().startswith("FROM ")), 0)
    return steps[start:]


def edit_one_line(entrypoints: Path) -> Path:
    """Change one line of the copied entrypoint code (a comment after its first import); returns the edited file."""
    path = entrypoints / EDITED_FILE
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    lines[index] = lines[index].rstrip("\n") + f"  # benchmark edit {secrets.token_hex(4)}\n"
    path.write_text("".join(lines))
    return path


def docker_or_reason():
    """(client, None) when a Docker engine answers, else (None, why not)."""
    try:
        return builder.docker_client(), None
    except Error as exc:
        return None, exc.message


def _fresh_base(client, standin: str) -> str:
    """A base image nobody built on yet (the stand-in plus a unique label): the first build can hit no cache."""
    with tempfile.TemporaryDirectory(prefix="trtllm-bench-base-") as tmp:
        Path(tmp, "Dockerfile").write_text(
            f"FROM {standin}\nLABEL io.trtllm-images.benchmark-run={secrets.token_hex(8)}\n"
        )
        builder.build_image(client, Path(tmp), "Dockerfile", BASE_REF, {}, lambda line: None)
    return BASE_REF


def standin_or_reason(client, say: Say) -> tuple[str | None, str | None]:
    """(stand-in image for TAG, None), built or refreshed by harness/build_standin.py; else (None, why not)."""
    from harness.build_standin import StandinUnavailable, build_standin

    try:
        return build_standin(TAG, client=client, log=say).image, None
    except (StandinUnavailable, RuntimeError) as exc:
        return None, f"no stand-in base image for {TAG}: {exc}"


def _timed_build(
    client, plan, dockerfiles, project_dir: Path, work: Path, matrix, vendor_dir: Path
) -> tuple[float, list]:
    """Seconds for what `build.py` does for the server image (wheel, context, docker build), and the build steps;
    `vendor_dir` is assembled once per process, as build.py does."""
    spec = plan.image("server")
    lines: list[str] = []
    started = time.monotonic()
    wheel_path = wheel.build_wheel(project_dir=project_dir, dest=work)
    matrix_json, models_json = model_support.image_data(matrix)
    context_dir = context.write_context(plan, dockerfiles, wheel_path, matrix_json, None, models_json, vendor_dir)
    builder.build_image(client, context_dir, spec.dockerfile, spec.ref, plan.buildargs, lines.append)
    return time.monotonic() - started, build_steps(lines)


@dataclass(frozen=True)
class Round:
    first_s: float
    rebuild_s: float
    added_bytes: int
    steps: list[Step]  # of the rebuild


def one_round(client, standin: str, work: Path, say: Say) -> Round:
    """A first build of the server image on a fresh base, then a rebuild after a one-line entrypoint edit."""
    matrix = matrix_mod.load()
    base = _fresh_base(client, standin)
    plan = make_build_plan(matrix.get(TAG), base_image=base, registry=REGISTRY, out_dir=work / "out")
    dockerfiles = render.render_dockerfiles(plan)
    copy = work / "entrypoints"
    shutil.copytree(wheel.ENTRYPOINTS_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    try:
        vendors = pipeline.vendor_dir(say)
        first_s, _ = _timed_build(client, plan, dockerfiles, copy, work / "wheel-a", matrix, vendors)
        added = client.api.inspect_image(plan.image("server").ref)["Size"] - client.api.inspect_image(base)["Size"]
        edit_one_line(copy)
        rebuild_s, steps = _timed_build(client, plan, dockerfiles, copy, work / "wheel-b", matrix, vendors)
    finally:
        _remove(client, [plan.image("server").ref, base])
    return Round(first_s, rebuild_s, added, steps)


def image_metrics(client, standin: str, work: Path, repeats: int, say: Say) -> list[Metric]:
    say(f"images: first build and one-line-edit rebuild of the {TAG} server image on {standin}: {repeats} runs")
    rounds = [one_round(client, standin, work / f"round-{i}", say) for i in range(repeats)]
    first, rebuild = [r.first_s for r in rounds], [r.rebuild_s for r in rounds]
    layers = layer_steps(rounds[-1].steps)
    hits = sum(s.cached for s in layers)
    first_miss = next((s.instruction for s in layers if not s.cached), "none")
    # Everything before the wheel's COPY must come from the cache; only the wheel and later layers may rebuild.
    wheel_step = next((i for i, s in enumerate(layers) if "wheels/" in s.instruction), len(layers))
    not_cached = max(sum(not s.cached for s in layer_steps(r.steps)[:wheel_step]) for r in rounds)
    return [
        Metric(
            "server image: bytes added to the base",
            median([r.added_bytes for r in rounds]),
            "B",
            Target("<", 50e6, "B"),
            details={"samples_bytes": [r.added_bytes for r in rounds]},
        ),
        Metric(
            "server image: first build on a warm base",
            median(first),
            "s",
            details={"samples_s": first, "repeats": repeats},
        ),
        Metric(
            "server image: rebuild after a one-line entrypoint edit",
            median(rebuild),
            "s",
            details={"samples_s": rebuild, "repeats": repeats},
        ),
        Metric("server image: rebuild / first build", median(rebuild) / median(first), "x"),
        Metric(
            "server image: rebuild, steps before the wheel COPY not cached",
            not_cached,
            "",
            Target("==", 0),
            note=f"cache hits: {hits} of {len(layers)} steps after FROM; first rebuilt: {first_miss}",
            details={"steps": [{"instruction": s.instruction[:80], "cached": s.cached} for s in layers]},
        ),
    ]


def _remove(client, refs: list[str]) -> None:
    """Remove the images this benchmark tagged (children first); what fails to go is left for `docker image prune`."""
    for ref in refs:
        with contextlib.suppress(Exception):  # cleanup must not hide the measurement's own error
            client.images.remove(ref)
