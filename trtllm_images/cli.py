"""The command line: `python build.py --tag 25.01` builds; `list`, `render` and `check` need no Docker.

With cli_options.py (what the commands share), the only module that imports click. Every command turns its options
into plans first (all bad input fails there, before anything is written or built), then executes them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import checks, render, tables, tiny_model
from trtllm_images import cli_options as shared
from trtllm_images import matrix as matrix_mod
from trtllm_images.kserve import options as kserve_options
from trtllm_images.kserve import plan as kserve
from trtllm_images.pipeline import (
    PROG,
    BuildOptions,
    LazyDocker,
    build_error,
    build_tags,
    check_errors,
    standin_push,
    write_context,
)
from trtllm_images.selection import DEFAULT_OUT, select_plans
from trtllm_images.sources import backend_assets, upstream
from trtllm_images.sources import cache as source_cache

# --- build (the group itself) --------------------------------------------------------------------------------------


@click.group(
    cls=shared.Group,
    invoke_without_command=True,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@shared.selection_options
@shared.plan_options
@click.option("--push", is_flag=True, help="Push the images after they built and verified (needs --registry).")
@click.option(
    "--revision",
    metavar="SHA",
    help="Source revision for the org.opencontainers.image.revision label "
    "(added last, so it never costs a cached layer).",
)
@shared.matrix_option
@shared.backend_options
@shared.out_option
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
    matrix, plans = select_plans(
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
                raise standin_push(plan.images[0].ref, plan.base_image)
    options = BuildOptions(
        matrix=matrix,
        backend_dir=backend_dir,
        require_pinned=require_pinned,
        out_dir=out_dir,
        push=push,
        say=shared.say,
    )
    outcomes = build_tags(plans, options, LazyDocker())
    click.echo(tables.build_summary([outcome.record for outcome in outcomes]))
    error = build_error(outcomes, out_dir)
    if error is not None:
        raise error


# --- list, render, check -------------------------------------------------------------------------------------------


@cli.command("list")
@shared.matrix_option
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
    click.echo(tables.matrix_listing(matrix, as_json=as_json, markdown=markdown), nl=False)


@cli.command("models")
@shared.matrix_option
@click.argument("name", required=False)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="As JSON; without NAME, the model list the images carry (models.json next to matrix.json).",
)
def models_command(matrix_path, name, as_json):
    """Which tags serve a model (a config.json model_type or architecture), and with which workflow."""
    click.echo(tables.models_listing(matrix_mod.load(matrix_path), name, as_json=as_json), nl=False)


@cli.command("render")
@shared.selection_options
@shared.plan_options
@shared.matrix_option
@shared.backend_options
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
    matrix, plans = select_plans(
        matrix_path,
        tags,
        all_tags,
        base_image=base_image,
        registry=registry,
        out_dir=out_dir or DEFAULT_OUT,
        multinode=multinode,
    )
    for plan in plans:
        dockerfiles = render.render_dockerfiles(plan)
        if print_:
            for name, text in dockerfiles.items():
                click.echo(f"# ===== {plan.entry.tag} {name} =====\n{text}")
        else:
            click.echo(write_context(plan, dockerfiles, matrix, backend_dir, require_pinned, shared.say))


@cli.command("check")
@shared.selection_options
@shared.matrix_option
def check_command(tags, all_tags, matrix_path):
    """Static checks: matrix consistency, Dockerfile policy, hadolint. Exit 1 when any error is found."""
    matrix, plans = select_plans(matrix_path, tags, all_tags, multinode=True)  # every Dockerfile, the group's too
    by_tag = {plan.entry.tag: plan for plan in plans}
    findings = checks.static_findings(matrix, by_tag, lambda tag: render.render_dockerfiles(by_tag[tag]))
    for finding in findings:
        shared.show_finding(finding)
    errors = check_errors(findings)
    click.echo(f"{len(plans)} tag(s) checked: {len(errors)} error(s), {len(findings) - len(errors)} other finding(s)")
    if errors:
        raise Error(f"{len(errors)} check(s) failed", "each failing check above has its hint")


def _kserve_options(func):
    """The flags of kserve_options.OPTIONS as click options: each declared once there, its type and default the
    KServeOptions field's."""
    for option in reversed(kserve_options.OPTIONS):
        if option.kind is bool:
            func = click.option(option.name, option.keyword, is_flag=True, help=option.help)(func)
            continue
        default: dict[str, Any] = {}  # none given where there is none: click takes None as a value for `required`
        if option.default is not None:
            default = {"default": option.default, "show_default": option.kind is not tuple}
        func = click.option(
            option.name,
            option.keyword,
            type=click.Choice(option.choices) if option.choices else _CLICK_TYPES[option.kind],
            multiple=option.kind is tuple,
            required=option.required,
            metavar=option.metavar,
            help=option.help,
            **default,
        )(func)
    return func


_CLICK_TYPES = {str: str, int: int, float: float, tuple: str}  # a tuple field: a repeatable text option


@cli.command("kserve")
@_kserve_options
@shared.matrix_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write one YAML file per kind into this directory  [default: print to stdout]",
)
def kserve_command(matrix_path, out_dir, **flags):
    """KServe manifests for one tag: runtime, InferenceService, optional cache PVC and warm-up Job, and with
    --max-replicas above --min-replicas its KEDA autoscaling and PodMonitor; with --nodes above 1, a LeaderWorkerSet
    group per replica with its Service and NetworkPolicy instead."""
    options = kserve_options.from_flags(flags)
    plan = kserve.make_kserve_plan(matrix_mod.load(matrix_path), options)
    if options.image is None and options.registry is None:
        shared.say(
            "warning: no --registry or --image: the manifests name the image without a registry, which a cluster "
            "pulls from Docker Hub; pass --registry HOST[/NAMESPACE] where you pushed it (`build.py --push`)"
        )
    if out_dir is None:
        click.echo(kserve.render_manifests(plan), nl=False)
        return
    for path in kserve.write_files(out_dir, kserve.render_files(plan)):
        shared.say(f"wrote {path}")


@cli.command("tiny-model")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="A new directory to write the checkpoint into.",
)
def tiny_model_command(out_dir):
    """A tiny Llama-shaped Hugging Face checkpoint for trying the stand-in images without a GPU or the hub: config,
    tokenizer (it knows the README's prompt) and one weight tensor. Serve it with `-v DIR:/models/tiny:ro -e
    MODEL_ID=/models/tiny`; the stand-in's engine double answers with tokens of the prompt. Real TensorRT-LLM cannot
    build an engine from it (it has one tensor)."""
    if out_dir.exists():
        raise UsageError(f"--out {out_dir} already exists", "name a new directory; nothing was written")
    click.echo(tiny_model.tiny_llama(out_dir))
    shared.say(f"serve it: docker run … -v {out_dir.resolve()}:/models/tiny:ro -e MODEL_ID=/models/tiny IMAGE")


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
@shared.matrix_option
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
    fresh = upstream.relock(lock, repin=repin, git_dir=git_dir, repo=repo, log=shared.say)
    unpinned = [pin.name for pin in fresh.pins if pin.digest is None]
    click.echo(
        f"wrote {upstream.write_lock(fresh)}: {len(fresh.pins)} sources, {len(unpinned)} without a digest"
        + (f" ({', '.join(unpinned)})" if unpinned else "")
    )


@upstream_group.command("fetch")
@_lock_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Also copy the files to DIR (new or empty), to carry to a machine without GitHub as its TRTLLM_UPSTREAM_DIR.",
)
def upstream_fetch_command(lock_path, out_dir):
    """Download and verify the tests' upstream files into the cache; prints the directory (a TRTLLM_UPSTREAM_DIR).
    A source the lock does not pin yet is trusted on first use, with a line saying so."""
    if out_dir is not None and out_dir.exists() and any(out_dir.iterdir()):
        raise click.UsageError(f"--out {out_dir} is not empty; name a new or empty directory")
    path = source_cache.materialize_layout(
        upstream.load_lock(lock_path),
        source_cache.cache_root(),
        local_copy="TRTLLM_UPSTREAM_DIR=<a copy> for the tests",
        log=shared.say,
    )
    if out_dir is None:
        click.echo(path)
        return
    shutil.copytree(path, out_dir, dirs_exist_ok=True)
    click.echo(out_dir)
    shared.say(f"carry {out_dir} to the other machine and set TRTLLM_UPSTREAM_DIR to where it lands")


def main() -> None:
    cli(prog_name=PROG)
