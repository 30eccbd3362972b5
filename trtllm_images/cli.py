"""The command line: `python build.py --tag 25.01` builds; `list`, `render` and `check` need no Docker.

The only module that imports click. Every command turns its options into plans first (all bad input fails there,
before anything is written or built), then executes them.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
from click.core import ParameterSource

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import (
    backend_assets,
    builder,
    checks,
    context,
    kserve,
    kserve_options,
    render,
    report,
    source_tree,
    support,
    upstream,
    vendor,
    verify,
    wheel,
)
from trtllm_images import matrix as matrix_mod
from trtllm_images.plan import STANDIN_LABEL_PREFIX, BuildPlan, make_plan

DEFAULT_OUT = Path("out")
PROG = "build.py"


class _Failure(click.ClickException):
    """An Error as click shows it: `error: …` and `hint: …` on stderr, exit code 1 (2 for usage)."""

    def __init__(self, error: Error):
        super().__init__(error.message)
        self.exit_code = error.exit_code  # type: ignore[misc]  # click types it as a ClassVar; it is read per instance
        self.hint = error.hint

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Error as exc:
            raise _Failure(exc) from exc
        except OSError as exc:  # a path the user gave (--out, --backend-dir): one line, not a traceback
            where = f"{exc.filename}: " if exc.filename else ""
            error = Error(f"{where}{exc.strerror or exc}", "check that --out names a writable directory")
            raise _Failure(error) from exc


def _say(message: str) -> None:
    click.echo(message, err=True)


# --- options shared by several commands ----------------------------------------------------------------------------


def _matrix_option(func):
    return click.option(
        "--matrix",
        "matrix_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=matrix_mod.DEFAULT_PATH,
        show_default="the repository's matrix.yaml",
        help="The version matrix to read.",
    )(func)


def _selection_options(func):
    func = click.option("--all", "all_tags", is_flag=True, help="Every supported tag of the matrix.")(func)
    return click.option(
        "--tag", "tags", multiple=True, metavar="TAG", help="An NGC release such as 25.01 (repeatable)."
    )(func)


def _plan_options(func):
    func = click.option(
        "--multinode",
        is_flag=True,
        help="Also build trtllm-serve-group: the server image plus OpenSSH, which the pods of a multi-node group "
        "(`kserve --nodes N`) need. Its OpenSSH comes from the base image's apt archives: the one networked step.",
    )(func)
    func = click.option(
        "--registry", metavar="HOST[/NAMESPACE]", help="Prefix of the image refs, e.g. ghcr.io/my-org."
    )(func)
    return click.option(
        "--base-image", metavar="IMAGE", help="Build FROM this image instead of the NGC one (only with a single --tag)."
    )(func)


def _backend_options(func):
    func = click.option(
        upstream.REQUIRE_PINNED_FLAG,
        "require_pinned",
        is_flag=True,
        help=f"Take only upstream sources that {upstream.LOCK_PATH.name} pins (release builds); otherwise a source "
        "not pinned there is trusted on first use and must match afterwards.",
    )(func)
    return click.option(
        "--backend-dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="A local checkout of the backend, for tags whose base image has no /app "
        "(instead of the pinned GitHub archives).",
    )(func)


def _out_option(func):
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_OUT,
        show_default=True,
        help="Where build contexts and reports go.",
    )(func)


# --- turning options into plans (pure apart from reading the matrix file) -----------------------------------------


def _plans(
    matrix_path: Path,
    tags: tuple[str, ...],
    all_tags: bool,
    *,
    base_image: str | None = None,
    registry: str | None = None,
    out_dir: Path = DEFAULT_OUT,
    revision: str | None = None,
    multinode: bool = False,
) -> tuple[matrix_mod.Matrix, list[BuildPlan]]:
    """Load the matrix and plan every selected tag; any bad tag or option fails here, before any work."""
    if tags and all_tags:
        raise UsageError("--tag and --all exclude each other", "give one or more --tag TAG, or --all")
    matrix = matrix_mod.load(matrix_path)
    if not tags and not all_tags:
        raise UsageError(
            "no tag selected",
            f"give --tag TAG (repeatable) or --all; known tags: {', '.join(e.tag for e in matrix.supported())}",
        )
    entries = matrix.supported() if all_tags else [matrix.get(tag) for tag in dict.fromkeys(tags)]
    if base_image and len(entries) != 1:
        raise UsageError(
            f"--base-image applies to a single tag, got {len(entries)} tags",
            "build the tags one by one, each with its own --base-image",
        )
    return matrix, [
        make_plan(e, base_image=base_image, registry=registry, out_dir=out_dir, revision=revision, multinode=multinode)
        for e in entries
    ]


@functools.cache
def _entrypoint_wheel() -> Path:
    """Built once per process (identical for every tag); write_context copies it into each context."""
    scratch = tempfile.TemporaryDirectory(prefix="trtllm-images-wheel-")
    atexit.register(scratch.cleanup)
    return wheel.build_wheel(dest=Path(scratch.name))


@functools.cache
def _vendor_dir() -> Path:
    """tini and the validation kit (vendor.lock.json), verified and assembled once per process."""
    scratch = tempfile.TemporaryDirectory(prefix="trtllm-images-vendor-")
    atexit.register(scratch.cleanup)
    return vendor.assemble(Path(scratch.name), _say)


def _write_context(
    plan: BuildPlan,
    dockerfiles: dict[str, str],
    matrix: matrix_mod.Matrix,
    backend_dir: Path | None,
    require_pinned: bool,
) -> Path:
    assets = None
    if plan.needs_backend_assets:
        assets = backend_assets.fetch(
            plan.entry, upstream.cache_root(), backend_dir, _say, require_pinned=require_pinned
        )
    matrix_json, models_json = support.image_data(matrix)
    return context.write_context(
        plan, dockerfiles, _entrypoint_wheel(), matrix_json, assets, models_json, _vendor_dir()
    )


def _errors(findings) -> list:
    return [f for f in findings if f.level == "error"]


def _show_finding(finding) -> None:
    click.echo(f"{finding.level:<7} {finding.tag or '-':<6} {finding.code}: {finding.message}")
    if finding.hint:
        click.echo(f"{'':<15}hint: {finding.hint}")


# --- build (the group itself) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BuildOptions:
    matrix: matrix_mod.Matrix
    backend_dir: Path | None
    require_pinned: bool
    out_dir: Path
    push: bool


@click.group(
    cls=_Group,
    invoke_without_command=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@_selection_options
@_plan_options
@click.option("--push", is_flag=True, help="Push the images after they built and verified (needs --registry).")
@click.option(
    "--revision",
    metavar="SHA",
    help="Source revision for the org.opencontainers.image.revision label "
    "(added last, so it never costs a cached layer).",
)
@_matrix_option
@_backend_options
@_out_option
@click.pass_context
def cli(
    ctx: click.Context,
    tags,
    all_tags,
    multinode,
    base_image,
    registry,
    push,
    revision,
    matrix_path,
    backend_dir,
    require_pinned,
    out_dir,
):
    """Build TensorRT-LLM + Triton serving images for NGC tags: `build.py --tag 25.01`.

    Without a command, builds the selected tags: static checks, build contexts, docker build of the server and
    builder images (and with --multinode the group image), verification inside each image, a report in
    OUT/reports/TAG.json.
    """
    if ctx.invoked_subcommand:
        given = [
            p.opts[0]
            for p in ctx.command.params
            if p.name and ctx.get_parameter_source(p.name) is not ParameterSource.DEFAULT
        ]
        if given:
            raise UsageError(
                f"options before `{ctx.invoked_subcommand}` apply only to builds: {', '.join(given)}",
                f"put options after the command: {PROG} {ctx.invoked_subcommand} --help",
            )
        return
    if push and not registry:
        raise UsageError("--push needs --registry", "e.g. --registry ghcr.io/my-org --push")
    matrix, plans = _plans(
        matrix_path,
        tags,
        all_tags,
        base_image=base_image,
        registry=registry,
        out_dir=out_dir,
        revision=revision,
        multinode=multinode,
    )
    if push:
        for plan in plans:
            if plan.standin:
                raise _standin_push(plan.images[0].ref, plan.base_image)
    options = _BuildOptions(
        matrix=matrix, backend_dir=backend_dir, require_pinned=require_pinned, out_dir=out_dir, push=push
    )
    docker = _LazyDocker()
    outcomes = []
    for number, plan in enumerate(plans, 1):
        _say(f"[{plan.entry.tag}] tag {number} of {len(plans)}: {', '.join(spec.ref for spec in plan.images)}")
        outcomes.append(_build_tag(plan, options, docker))
    _print_summary([outcome.record for outcome in outcomes])
    if len(outcomes) == 1 and outcomes[0].error:
        raise outcomes[0].error
    failed = [outcome for outcome in outcomes if outcome.error]
    if failed:
        raise Error(
            f"{len(failed)} of {len(outcomes)} tags failed: {', '.join(outcome.record.tag for outcome in failed)}",
            f"the reports in {out_dir / 'reports'} say why",
        )


@dataclass(frozen=True)
class _Outcome:
    record: report.BuildRecord
    error: Error | None


class _LazyDocker:
    """Connects on first use, so tags that fail their static checks never need a Docker engine."""

    def __init__(self):
        self._client = None

    def __call__(self):
        if self._client is None:
            self._client = builder.docker_client()
        return self._client


def _build_tag(plan: BuildPlan, options: _BuildOptions, docker: _LazyDocker) -> _Outcome:
    """Check, write the context, build, verify and (maybe) push one tag; the report is written whatever happens."""
    record = report.BuildRecord(plan.entry.tag)
    record.base_image = plan.base_image
    error = None
    try:
        with _step(record, plan, "checks"):
            dockerfiles = render.render(plan)
            findings = checks.static_findings(options.matrix, [plan.entry.tag], lambda tag: dockerfiles)
            record.add_findings(findings)
            _stop_on_check_errors(plan, findings)
        with _step(record, plan, "context"):
            context_dir = _write_context(plan, dockerfiles, options.matrix, options.backend_dir, options.require_pinned)
        _build_images(plan, context_dir, record, docker())
        _verify_images(plan, record, docker())
        if options.push:
            _push_images(plan, record, docker())
    except Error as exc:
        record.fail(exc.message, exc.hint)
        error = exc
        _say(f"[{plan.entry.tag}] failed: {exc.message}")
    except BaseException as exc:
        # A bug or Ctrl-C: the report must not claim success; the exception keeps its traceback.
        record.fail(f"stopped by {type(exc).__name__}: {exc}", "")
        raise
    finally:
        _say(f"[{plan.entry.tag}] report: {report.write_report(options.out_dir, record)}")
    return _Outcome(record, error)


def _stop_on_check_errors(plan: BuildPlan, findings) -> None:
    for finding in findings:
        _say(f"[{plan.entry.tag}] {finding.level}: {finding.code}: {finding.message}")
    errors = _errors(findings)
    if errors:
        raise Error(
            f"tag {plan.entry.tag}: {len(errors)} static check error(s): "
            + "; ".join(f"{f.code}: {f.message}" for f in errors),
            f"`{PROG} check --tag {plan.entry.tag}` shows each with its hint",
        )


def _build_images(plan: BuildPlan, context_dir: Path, record: report.BuildRecord, client) -> None:
    with _step(record, plan, "base image") as progress:
        builder.ensure_base_image(client, plan.base_image, progress("pull"))
    for spec in plan.images:
        with _step(record, plan, f"build {spec.kind}") as progress:
            image_id = builder.build_image(
                client, context_dir, spec.dockerfile, spec.ref, plan.buildargs, progress(spec.kind)
            )
        record.add_image(spec.kind, spec.ref, image_id)


def _standin_push(ref: str, base: str) -> UsageError:
    return UsageError(
        f"refusing to push {ref}: it is built FROM {base}, a stand-in of the NGC image with test doubles for the "
        "GPU programs",
        "push images built FROM the NGC image (or a mirror of it: --base-image)",
    )


def _push_images(plan: BuildPlan, record: report.BuildRecord, client) -> None:
    for spec in plan.images:  # a stand-in under another name still carries its labels
        if any(key.startswith(STANDIN_LABEL_PREFIX) for key in verify.image_labels(client, spec.ref)):
            raise _standin_push(spec.ref, plan.base_image)
    for spec in plan.images:
        with _step(record, plan, f"push {spec.kind}") as progress:
            builder.push(client, spec.ref, progress(f"push {spec.kind}"))
        record.pushed.append(spec.ref)


def _verify_images(plan: BuildPlan, record: report.BuildRecord, client) -> None:
    results = []
    for spec in plan.images:
        with _step(record, plan, f"verify {spec.kind}"):
            result = verify.verify_image(client, plan.entry, spec.kind, spec.ref)
        record.add_verification(result)
        for warning in result.warnings:
            _say(f"[{plan.entry.tag} {spec.kind}] warning: {warning}")
        results.append(result)
    if any(result.errors for result in results):
        # An image that does not match the matrix must not be found under its name, pushed or run by mistake.
        for spec in plan.images:
            builder.untag(client, spec.ref)
        _say(f"[{plan.entry.tag}] removed the tags {', '.join(spec.ref for spec in plan.images)}")
    for result in results:
        result.raise_for_errors()


@contextmanager
def _step(record: report.BuildRecord, plan: BuildPlan, name: str) -> Iterator[Callable[[str], Callable[[str], None]]]:
    """One timed phase of a tag, announced when it starts and ends with its elapsed time (the report records it too);
    yields progress(what) -> a printer that prefixes each streamed line with the tag, `what` and the elapsed time."""
    tag, started = plan.entry.tag, time.monotonic()
    _say(f"[{tag}] {name} ...")

    def progress(what: str) -> Callable[[str], None]:
        return lambda line: _say(f"[{tag} {what} {time.monotonic() - started:.0f}s] {line}")

    try:
        with record.phase(name):
            yield progress
    except BaseException:
        _say(f"[{tag}] {name} failed after {time.monotonic() - started:.1f}s")
        raise
    _say(f"[{tag}] {name} done in {time.monotonic() - started:.1f}s")


def _print_summary(records: list[report.BuildRecord]) -> None:
    rows: list[tuple[str, ...]] = [("TAG", "RESULT", "IMAGES", "WARNINGS", "SECONDS")]
    for record in records:
        warnings = sum(len(v["warnings"]) for v in record.verifications)
        refs = ", ".join(image["ref"] for image in record.images) or "-"
        rows.append(
            (record.tag, "ok" if record.ok else "FAILED", refs, str(warnings), f"{sum(record.durations.values()):.0f}")
        )
    click.echo(_table(rows))


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


# --- list, render, check -------------------------------------------------------------------------------------------

LIST_COLUMNS = (
    ("TAG", "tag"),
    ("STATUS", "status"),
    ("TRITON", "triton"),
    ("TRT-LLM", "tensorrt_llm"),
    ("TENSORRT", "tensorrt"),
    ("PYTHON", "python"),
    ("WORKFLOWS", "workflows"),
)


@cli.command("list")
@_matrix_option
@click.option("--supported", "supported_only", is_flag=True, help="Only the tags that can be built.")
@click.option("--json", "as_json", is_flag=True, help="The matrix as JSON (the format the images carry).")
@click.option("--markdown", is_flag=True, help="The table in docs/matrix.md.")
def list_command(matrix_path, supported_only, as_json, markdown):
    """Show the matrix: one row per NGC tag; `?` marks a value the matrix calls uncertain."""
    if as_json and markdown:
        raise UsageError("--json and --markdown exclude each other", "pick one output format")
    matrix = matrix_mod.load(matrix_path)
    if supported_only:
        matrix = matrix_mod.Matrix(matrix.supported())
    if as_json:
        click.echo(support.image_matrix_json(matrix, support.load_capabilities()), nl=False)
    elif markdown:
        click.echo(matrix_mod.markdown_table(matrix), nl=False)
    else:
        click.echo(_list_table(matrix))


def _list_table(matrix: matrix_mod.Matrix) -> str:
    rows = [tuple(title for title, _ in LIST_COLUMNS) + ("NOTE",)]
    for entry in matrix.entries:
        cells = []
        for _, field in LIST_COLUMNS:
            value = getattr(entry, field)
            text = ",".join(value) if isinstance(value, tuple) else (value or "-")
            cells.append(text + ("?" if field in entry.uncertain else ""))
        rows.append(tuple(cells) + (entry.note,))
    return _table(rows) + "\n\n? = uncertain: matrix.yaml says why under `uncertain:`"


@cli.command("models")
@_matrix_option
@click.argument("name", required=False)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="As JSON; without NAME, the model list the images carry (models.json next to matrix.json).",
)
def models_command(matrix_path, name, as_json):
    """Which tags serve a model (a config.json model_type or architecture), and with which workflow."""
    matrix = matrix_mod.load(matrix_path)
    capabilities, models = support.load_capabilities(), support.load_models()
    if name is None:
        if as_json:
            click.echo(support.models_json(models, matrix, capabilities), nl=False)
        else:
            click.echo(_models_table(models, matrix, capabilities))
        return
    model = support.find(models, name)
    record = support.model_record(model, matrix, capabilities)
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    rows = [("TAG", "TRT-LLM", "ENGINE", "LLMAPI")]
    for entry in matrix.supported():
        caps = capabilities.of(entry)
        engine = model.serves(entry, caps, "engine")
        folder = model.converter_dir(caps.examples_layout) if engine else "-"
        rows.append(
            (entry.tag, entry.tensorrt_llm or "-", folder, "yes" if model.serves(entry, caps, "llmapi") else "-")
        )
    notes = [f"{key} is uncertain: {why}" for key, why in sorted(model.uncertain.items())]
    click.echo(
        f"{model.model_type} ({', '.join(model.architectures)}): engine from TensorRT-LLM "
        f"{model.engine.since if model.engine else '(none)'}, llmapi from {model.llmapi_since or '(none)'}\n"
    )
    click.echo(_table(rows) + "".join(f"\n{note}" for note in notes))


def _models_table(models, matrix: matrix_mod.Matrix, capabilities) -> str:
    rows = [("MODEL_TYPE", "ARCHITECTURES", "ENGINE TAGS", "LLMAPI TAGS")]
    for model in models:
        record = support.model_record(model, matrix, capabilities)
        spans = [_span(record[w]["tags"]) if record[w] else "-" for w in ("engine", "llmapi")]
        rows.append((model.model_type + ("?" if model.uncertain else ""), ",".join(model.architectures), *spans))
    return _table(rows) + "\n\n? = uncertain: models.yaml says why under `uncertain:`"


def _span(tags: list[str]) -> str:
    return f"{tags[0]}..{tags[-1]}" if tags else "none"


@cli.command("render")
@_selection_options
@_plan_options
@_matrix_option
@_backend_options
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write complete build contexts to OUT/context/TAG (what a build would send to Docker).",
)
@click.option("--print", "print_", is_flag=True, help="Print the Dockerfiles instead.")
def render_command(
    tags, all_tags, multinode, base_image, registry, matrix_path, backend_dir, require_pinned, out_dir, print_
):
    """Render the Dockerfiles (and build contexts) without Docker."""
    if bool(out_dir) == print_:
        raise UsageError(
            "give exactly one of --out DIR or --print", "--print shows the Dockerfiles; --out writes the build contexts"
        )
    matrix, plans = _plans(
        matrix_path,
        tags,
        all_tags,
        base_image=base_image,
        registry=registry,
        out_dir=out_dir or DEFAULT_OUT,
        multinode=multinode,
    )
    for plan in plans:
        dockerfiles = render.render(plan)
        if print_:
            for name, text in dockerfiles.items():
                click.echo(f"# ===== {plan.entry.tag} {name} =====\n{text}")
        else:
            click.echo(_write_context(plan, dockerfiles, matrix, backend_dir, require_pinned))


@cli.command("check")
@_selection_options
@_matrix_option
def check_command(tags, all_tags, matrix_path):
    """Static checks: matrix consistency, Dockerfile policy, hadolint. Exit 1 when any error is found."""
    matrix, plans = _plans(matrix_path, tags, all_tags, multinode=True)  # every Dockerfile, the group's too
    by_tag = {plan.entry.tag: plan for plan in plans}
    findings = checks.static_findings(matrix, by_tag, lambda tag: render.render(by_tag[tag]))
    for finding in findings:
        _show_finding(finding)
    errors = _errors(findings)
    click.echo(f"{len(plans)} tag(s) checked: {len(errors)} error(s), {len(findings) - len(errors)} other finding(s)")
    if errors:
        raise Error(f"{len(errors)} check(s) failed", "each failing check above has its hint")


# The options' defaults are KServeOptions' own.
_KSERVE = {f.name: f.default for f in dataclasses.fields(kserve_options.KServeOptions)}


@cli.command("kserve")
@click.option("--tag", required=True, help="The NGC tag whose server image the runtime runs, e.g. 25.01.")
@click.option("--image", help="Full image ref (default: the server image build.py makes for --tag).")
@click.option("--registry", metavar="HOST[/NAMESPACE]", help="Prefix of the default image ref, e.g. ghcr.io/my-org.")
@click.option("--model-id", help="Hugging Face model id the pod downloads (or give --storage-uri).")
@click.option("--model-revision", help="Pin the hub model to a revision.")
@click.option("--storage-uri", help="KServe puts the model at /mnt/models: s3://, gs://, pvc://, hf://, …")
@click.option("--tp-size", type=int, default=_KSERVE["tp_size"], show_default=True, help="Tensor parallelism.")
@click.option(
    "--pp-size", type=int, default=_KSERVE["pp_size"], show_default=True, help="Pipeline parallelism (GPUs = TP x PP)."
)
@click.option("--namespace", default=_KSERVE["namespace"], show_default=True)
@click.option(
    "--name", default=_KSERVE["name"], show_default=True, help="InferenceService name, also the served model name."
)
@click.option(
    "--cache",
    type=click.Choice(kserve_options.CACHE_MODES),
    default=_KSERVE["cache"],
    show_default=True,
    help="Where engines are cached: per pod (emptydir) or on a PersistentVolumeClaim (pvc).",
)
@click.option("--pvc-name", help="Cache PVC name  [default: <name>-trtllm-cache]")
@click.option("--pvc-size", default=_KSERVE["pvc_size"], show_default=True)
@click.option(
    "--pvc-access-mode",
    type=click.Choice(kserve_options.ACCESS_MODES),
    default=_KSERVE["pvc_access_mode"],
    show_default=True,
    help="ReadWriteMany whenever several pods mount the cache (replicas, a group's pods, the warm Job).",
)
@click.option("--pvc-storage-class", help="The cache PVC's StorageClass (one that provides the access mode).")
@click.option(
    "--namespaced-runtime", is_flag=True, help="A ServingRuntime in --namespace, not a ClusterServingRuntime."
)
@click.option(
    "--warm-job", is_flag=True, help="Add a Job that builds the engine into the cache PVC (needs --cache pvc)."
)
@click.option(
    "--hf-token-secret",
    default=_KSERVE["hf_token_secret"],
    show_default=True,
    help="Secret holding the Hugging Face token under key 'token' (optional at run time).",
)
@click.option("--no-hf-token", is_flag=True, help="Reference no token Secret.")
@click.option(
    "--admin-key-secret",
    default=_KSERVE["admin_key_secret"],
    show_default=True,
    help="Secret holding the key of Triton's restricted APIs under key 'key' (optional at run time; "
    "without it those APIs stay closed).",
)
@click.option("--no-admin-key", is_flag=True, help="Reference no admin-key Secret.")
@click.option("--storage-writable", is_flag=True, help="Mount /mnt/models read-write (default: read-only).")
@click.option(
    "--frontend",
    type=click.Choice(kserve_options.FRONTENDS),
    default="triton",
    show_default=True,
    help="openai: Triton's OpenAI-compatible frontend on the HTTP port, probed at /health/ready (tags from 24.12).",
)
@click.option("--min-replicas", type=int, default=1, show_default=True, help="Replicas (groups with --nodes) at least.")
@click.option(
    "--max-replicas",
    type=int,
    default=None,
    help="Replicas at most; above --min-replicas: autoscaling with KEDA on Triton's queue/compute ratio and a "
    "PodMonitor (needs KEDA and the Prometheus Operator)  [default: --min-replicas, a fixed count]",
)
@click.option(
    "--scale-target",
    type=float,
    default=1.0,
    show_default=True,
    help="Scale out while Triton's queue time exceeds this multiple of its compute time.",
)
@click.option(
    "--scale-down-window", type=int, default=600, show_default=True, help="Seconds of lower load before scaling in."
)
@click.option(
    "--prometheus-url",
    default="http://prometheus-operated.monitoring.svc:9090",
    show_default=True,
    help="The Prometheus the autoscaler queries.",
)
@click.option(
    "--nodes",
    type=int,
    default=1,
    show_default=True,
    help="Pods (nodes) per model replica; above 1: a LeaderWorkerSet group instead of an InferenceService.",
)
@click.option("--ssh-secret", help="Secret with the group's MPI ssh key  [default: <name>-mpi-ssh]")
@click.option("--node-selector", multiple=True, metavar="KEY=VALUE", help="Node label every pod needs (repeatable).")
@click.option(
    "--toleration",
    "tolerations",
    multiple=True,
    metavar="KEY[=VALUE][:EFFECT]",
    help="A taint every pod tolerates, e.g. nvidia.com/gpu:NoSchedule (repeatable).",
)
@click.option("--affinity", metavar="JSON", help="A Kubernetes Affinity object for every pod, as JSON.")
@click.option(
    "--image-pull-secret", "image_pull_secrets", multiple=True, metavar="NAME", help="Pull secret (repeatable)."
)
@click.option("--service-account", metavar="NAME", help="Service account of every pod.")
@click.option("--priority-class", metavar="NAME", help="PriorityClass of every pod.")
@click.option(
    "--env", multiple=True, metavar="NAME=VALUE", help="Extra environment of every pod, e.g. MAX_BATCH_SIZE=64."
)
@click.option("--cpu", default=_KSERVE["cpu"], show_default=True, help="CPU request of each serving pod.")
@click.option("--memory", default=_KSERVE["memory"], show_default=True, help="Memory request of each serving pod.")
@click.option("--cpu-limit", help="CPU limit  [default: none, a limit throttles tokenization]")
@click.option("--memory-limit", help="Memory limit  [default: --memory]")
@_matrix_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write one YAML file per kind into this directory  [default: print to stdout]",
)
def kserve_command(
    matrix_path, out_dir, no_hf_token, hf_token_secret, no_admin_key, admin_key_secret, storage_writable, **values
):
    """KServe manifests for one tag: runtime, InferenceService, optional cache PVC and warm-up Job, and with
    --max-replicas above --min-replicas its KEDA autoscaling and PodMonitor; with --nodes above 1, a LeaderWorkerSet
    group per replica with its Service and NetworkPolicy instead."""
    if values["max_replicas"] is None:  # autoscaling is opt-in: it needs KEDA and the Prometheus Operator
        values["max_replicas"] = values["min_replicas"]
    options = kserve_options.KServeOptions(
        hf_token_secret=None if no_hf_token else hf_token_secret,
        admin_key_secret=None if no_admin_key else admin_key_secret,
        storage_readonly=not storage_writable,
        **values,
    )
    plan = kserve.make_plan(matrix_mod.load(matrix_path), options)
    if out_dir is None:
        click.echo(kserve.render(plan), nl=False)
        return
    for path in kserve.write_files(out_dir, kserve.render_files(plan)):
        _say(f"wrote {path}")


@cli.group("upstream")
def upstream_group():
    """The pinned upstream archives (upstream.lock.json): backend sources for tags without /app, test files."""


def _lock_option(func):
    return click.option(
        "--lock",
        "lock_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=upstream.LOCK_PATH,
        show_default="the repository's upstream.lock.json",
        help="The lock file.",
    )(func)


@upstream_group.command("lock")
@_matrix_option
@_lock_option
@click.option(
    "--repin",
    multiple=True,
    metavar="REPO@REF",
    help="Accept a new commit and digest for this source (repeatable); otherwise a change is an error.",
)
@click.option(
    "--from-git",
    "git_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Record from the objects of this clone or mirror instead of downloading (no network needed).",
)
@click.option(
    "--repo",
    metavar="OWNER/NAME",
    help="The repository --from-git DIR is a clone of (default: from its remote.origin.url).",
)
def upstream_lock_command(matrix_path, lock_path, repin, git_dir, repo):
    """Record the commit and content digest of every source the matrix and the tests need: from GitHub archives
    (needs GitHub), or with --from-git from a clone of one repository."""
    lock = upstream.merge(upstream.load_lock(lock_path), backend_assets.lock_paths(matrix_mod.load(matrix_path)))
    if git_dir is None:
        if repo:
            raise UsageError("--repo applies only with --from-git", "add --from-git DIR, or drop --repo")
        fresh = upstream.refresh(lock, repin=repin, log=_say)
    else:
        repo = repo or source_tree.origin_repo(git_dir)
        fresh = upstream.refresh_from_git(lock, repo, git_dir, repin=repin, log=_say)
    unpinned = [pin.name for pin in fresh.pins if pin.digest is None]
    click.echo(
        f"wrote {upstream.write_lock(fresh)}: {len(fresh.pins)} sources, {len(unpinned)} without a digest"
        + (f" ({', '.join(unpinned)})" if unpinned else "")
    )


@upstream_group.command("fetch")
@_lock_option
def upstream_fetch_command(lock_path):
    """Download and verify the tests' upstream files into the cache; prints the directory (a TRTLLM_UPSTREAM_DIR).
    A source the lock does not pin yet is trusted on first use, with a line saying so."""
    path = upstream.materialize_layout(
        upstream.load_lock(lock_path),
        upstream.cache_root(),
        local_copy="TRTLLM_UPSTREAM_DIR=<a copy> for the tests",
        log=_say,
    )
    click.echo(path)


def main() -> None:
    cli(prog_name=PROG)
