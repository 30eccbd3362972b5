"""What the commands of cli.py share: an Error shown as click shows failures (one line and a hint, exit 1 or 2), and
the options several commands take. With cli.py, the only modules that import click."""

from __future__ import annotations

from pathlib import Path

import click

from trtllm_entrypoint.errors import Error
from trtllm_images import matrix as matrix_mod
from trtllm_images.selection import DEFAULT_OUT
from trtllm_images.sources import upstream


class Failure(click.ClickException):
    """An Error as click shows it: `error: …` and `hint: …` on stderr, exit code 1 (2 for usage)."""

    def __init__(self, error: Error):
        super().__init__(error.message)
        self.exit_code = error.exit_code  # type: ignore[misc]  # click types it as a ClassVar; it is read per instance
        self.hint = error.hint

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


class Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Error as exc:
            raise Failure(exc) from exc
        except OSError as exc:  # a path the user gave (--out, --backend-dir): one line, not a traceback
            where = f"{exc.filename}: " if exc.filename else ""
            error = Error(f"{where}{exc.strerror or exc}", "check that --out names a writable directory")
            raise Failure(error) from exc


def say(message: str) -> None:
    click.echo(message, err=True)


# --- options shared by several commands ----------------------------------------------------------------------------


def matrix_option(func):
    return click.option(
        "--matrix",
        "matrix_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=matrix_mod.DEFAULT_PATH,
        show_default="the repository's matrix.yaml",
        help="The version matrix to read.",
    )(func)


def selection_options(func):
    func = click.option("--all", "all_tags", is_flag=True, help="Every supported tag of the matrix.")(func)
    return click.option(
        "--tag", "tags", multiple=True, metavar="TAG", help="An NGC release such as 25.01 (repeatable)."
    )(func)


def plan_options(func):
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


def backend_options(func):
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


def out_option(func):
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_OUT,
        show_default=True,
        help="Where build contexts and reports go.",
    )(func)


def show_finding(finding) -> None:
    click.echo(f"{finding.level:<7} {finding.tag or '-':<6} {finding.code}: {finding.message}")
    if finding.hint:
        click.echo(f"{'':<15}hint: {finding.hint}")
