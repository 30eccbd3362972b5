"""The build pipeline behind `python build.py --tag …`: per tag, static checks, the build context, docker build of
each image, verification inside it, a push when asked, and a report written whatever happens. No click: cli.py turns
options into plans and hands them here, with `say`, the printer of progress lines.
"""

from __future__ import annotations

import atexit
import functools
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import builder, checks, context, model_support, render, report, verify, wheel
from trtllm_images import matrix as matrix_mod
from trtllm_images.plan import STANDIN_LABEL_PREFIX, BuildPlan
from trtllm_images.sources import backend_assets, vendor
from trtllm_images.sources import cache as source_cache

PROG = "build.py"

Say = Callable[[str], None]


@functools.cache
def entrypoint_wheel() -> Path:
    """Built once per process (identical for every tag); write_context copies it into each context."""
    scratch = tempfile.TemporaryDirectory(prefix="trtllm-images-wheel-")
    atexit.register(scratch.cleanup)
    return wheel.build_wheel(dest=Path(scratch.name))


@functools.cache
def vendor_dir(say: Say) -> Path:
    """tini and the validation kit (vendor.lock.json), verified and assembled once per process."""
    scratch = tempfile.TemporaryDirectory(prefix="trtllm-images-vendor-")
    atexit.register(scratch.cleanup)
    return vendor.assemble(Path(scratch.name), say)


def write_context(
    plan: BuildPlan,
    dockerfiles: dict[str, str],
    matrix: matrix_mod.Matrix,
    backend_dir: Path | None,
    require_pinned: bool,
    say: Say,
) -> Path:
    assets = None
    if plan.needs_backend_assets:
        assets = backend_assets.fetch(
            plan.entry, source_cache.cache_root(), backend_dir, say, require_pinned=require_pinned
        )
    matrix_json, models_json = model_support.image_data(matrix)
    return context.write_context(
        plan, dockerfiles, entrypoint_wheel(), matrix_json, assets, models_json, vendor_dir(say)
    )


def check_errors(findings) -> list:
    return [f for f in findings if f.level == "error"]


def standin_push(ref: str, base: str) -> UsageError:
    return UsageError(
        f"refusing to push {ref}: it is built FROM {base}, a stand-in of the NGC image with test doubles for the "
        "GPU programs",
        "push images built FROM the NGC image (or a mirror of it: --base-image)",
    )


@dataclass(frozen=True)
class BuildOptions:
    matrix: matrix_mod.Matrix
    backend_dir: Path | None
    require_pinned: bool
    out_dir: Path
    push: bool
    say: Say


@dataclass(frozen=True)
class Outcome:
    record: report.BuildRecord
    error: Error | None


class LazyDocker:
    """Connects on first use, so tags that fail their static checks never need a Docker engine."""

    def __init__(self):
        self._client = None

    def __call__(self):
        if self._client is None:
            self._client = builder.docker_client()
        return self._client


def build_tag(plan: BuildPlan, options: BuildOptions, docker: LazyDocker) -> Outcome:
    """Check, write the context, build, verify and (maybe) push one tag; the report is written whatever happens."""
    say = options.say
    record = report.BuildRecord(plan.entry.tag)
    record.base_image = plan.base_image
    error = None
    try:
        with _step(record, plan, "checks", say):
            dockerfiles = render.render_dockerfiles(plan)
            findings = checks.static_findings(options.matrix, [plan.entry.tag], lambda tag: dockerfiles)
            record.add_findings(findings)
            _stop_on_check_errors(plan, findings, say)
        with _step(record, plan, "context", say):
            context_dir = write_context(
                plan, dockerfiles, options.matrix, options.backend_dir, options.require_pinned, say
            )
        _build_images(plan, context_dir, record, docker(), say)
        _verify_images(plan, record, docker(), say)
        if options.push:
            _push_images(plan, record, docker(), say)
    except Error as exc:
        record.fail(exc.message, exc.hint)
        error = exc
        say(f"[{plan.entry.tag}] failed: {exc.message}")
    except BaseException as exc:
        # A bug or Ctrl-C: the report must not claim success; the exception keeps its traceback.
        record.fail(f"stopped by {type(exc).__name__}: {exc}", "")
        raise
    finally:
        say(f"[{plan.entry.tag}] report: {report.write_report(options.out_dir, record)}")
    return Outcome(record, error)


def build_tags(plans: list[BuildPlan], options: BuildOptions, docker: LazyDocker) -> list[Outcome]:
    """Each plan's tag built in turn; a failed tag does not stop the others (its report says why)."""
    outcomes = []
    for number, plan in enumerate(plans, 1):
        options.say(f"[{plan.entry.tag}] tag {number} of {len(plans)}: {', '.join(spec.ref for spec in plan.images)}")
        outcomes.append(build_tag(plan, options, docker))
    return outcomes


def build_error(outcomes: list[Outcome], out_dir: Path) -> Error | None:
    """The error a build of these tags ends with: a single tag's own, or how many of several failed."""
    if len(outcomes) == 1 and outcomes[0].error:
        return outcomes[0].error
    failed = [outcome for outcome in outcomes if outcome.error]
    if not failed:
        return None
    return Error(
        f"{len(failed)} of {len(outcomes)} tags failed: {', '.join(outcome.record.tag for outcome in failed)}",
        f"the reports in {out_dir / 'reports'} say why",
    )


def _stop_on_check_errors(plan: BuildPlan, findings, say: Say) -> None:
    for finding in findings:
        say(f"[{plan.entry.tag}] {finding.level}: {finding.code}: {finding.message}")
    errors = check_errors(findings)
    if errors:
        raise Error(
            f"tag {plan.entry.tag}: {len(errors)} static check error(s): "
            + "; ".join(f"{f.code}: {f.message}" for f in errors),
            f"`{PROG} check --tag {plan.entry.tag}` shows each with its hint",
        )


def _build_images(plan: BuildPlan, context_dir: Path, record: report.BuildRecord, client, say: Say) -> None:
    with _step(record, plan, "base image", say) as progress:
        builder.ensure_base_image(client, plan.base_image, progress("pull"))
    for spec in plan.images:
        with _step(record, plan, f"build {spec.kind}", say) as progress:
            image_id = builder.build_image(
                client, context_dir, spec.dockerfile, spec.ref, plan.buildargs, progress(spec.kind)
            )
        record.add_image(spec.kind, spec.ref, image_id)


def _push_images(plan: BuildPlan, record: report.BuildRecord, client, say: Say) -> None:
    for spec in plan.images:  # a stand-in under another name still carries its labels
        if any(key.startswith(STANDIN_LABEL_PREFIX) for key in verify.image_labels(client, spec.ref)):
            raise standin_push(spec.ref, plan.base_image)
    for spec in plan.images:
        with _step(record, plan, f"push {spec.kind}", say) as progress:
            builder.push(client, spec.ref, progress(f"push {spec.kind}"))
        record.pushed.append(spec.ref)


def _verify_images(plan: BuildPlan, record: report.BuildRecord, client, say: Say) -> None:
    results = []
    for spec in plan.images:
        with _step(record, plan, f"verify {spec.kind}", say):
            result = verify.verify_image(client, plan.entry, spec.kind, spec.ref)
        record.add_verification(result)
        for warning in result.warnings:
            say(f"[{plan.entry.tag} {spec.kind}] warning: {warning}")
        results.append(result)
    if any(result.errors for result in results):
        # An image that does not match the matrix must not be found under its name, pushed or run by mistake.
        for spec in plan.images:
            builder.untag(client, spec.ref)
        say(f"[{plan.entry.tag}] removed the tags {', '.join(spec.ref for spec in plan.images)}")
    for result in results:
        result.raise_for_errors()


@contextmanager
def _step(
    record: report.BuildRecord, plan: BuildPlan, name: str, say: Say
) -> Iterator[Callable[[str], Callable[[str], None]]]:
    """One timed phase of a tag, announced when it starts and ends with its elapsed time (the report records it too);
    yields progress(what) -> a printer that prefixes each streamed line with the tag, `what` and the elapsed time."""
    tag, started = plan.entry.tag, time.monotonic()
    say(f"[{tag}] {name} ...")

    def progress(what: str) -> Callable[[str], None]:
        return lambda line: say(f"[{tag} {what} {time.monotonic() - started:.0f}s] {line}")

    try:
        with record.phase(name):
            yield progress
    except BaseException:
        say(f"[{tag}] {name} failed after {time.monotonic() - started:.1f}s")
        raise
    say(f"[{tag}] {name} done in {time.monotonic() - started:.1f}s")
