"""Writing the filled model repository, through the one publisher (`publish`): checked before it is visible, stamped
with its content, and never written over a directory that is not ours.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.repository import served_code
from trtllm_entrypoint.repository.check import validate_repository
from trtllm_entrypoint.repository.fill import FillPlan
from trtllm_entrypoint.storage import publish, trust
from trtllm_entrypoint.storage.paths import open_lock, under_model_dir, within

if TYPE_CHECKING:
    from trtllm_entrypoint.log import Log

STAMP = ".trtllm-stamp.json"  # our marker: Triton loads only the repository's subdirectories
LOCK_HINT = (
    "another replica is writing this model repository (a dead holder releases the lock): wait longer with "
    "a larger LOCK_TIMEOUT_SECS; on a shared volume, check that it supports flock"
)


def user_files(dest: Path) -> list[str]:
    """What in a repository we wrote is not ours: every file or directory its stamp does not list, save the bytecode
    the server writes next to model.py (`__pycache__/*.pyc`). Sorted; a directory of the user's is named, not its
    content."""
    listed, recorded = publish.listed(dest, STAMP)
    listed.add(STAMP)
    parents = {parent.as_posix() for name in listed for parent in Path(name).parents}
    if recorded is None:  # a stamp from before directories were recorded: our empty version folders hold nothing
        recorded = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if publish.is_empty_dir(p)}
    parents |= recorded
    found: list[str] = []
    for directory, dirs, files in os.walk(dest):
        here = Path(directory).relative_to(dest)
        for name in sorted(dirs):
            relative = (here / name).as_posix()
            path = dest / relative
            if path.is_symlink() or (relative not in parents and not _bytecode_dir(path)):
                found.append(relative + ("" if path.is_symlink() else "/"))
        dirs[:] = [d for d in dirs if (here / d).as_posix() in parents]
        found += [(here / name).as_posix() for name in files if (here / name).as_posix() not in listed]
    return sorted(found)


def _bytecode_dir(path: Path) -> bool:
    return path.name == served_code.BYTECODE_DIR and all(
        entry.is_file() and not entry.is_symlink() and entry.suffix == ".pyc" for entry in path.iterdir()
    )


def refuse_user_files(dest: Path) -> None:
    """REPOSITORY_DIR is rewritten when the settings change; files of the user's in it are never deleted."""
    found = user_files(dest)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise UsageError(
            f"REPOSITORY_DIR={str(dest)!r} is not allowed: it holds what trtllm-entrypoint did not write ({shown}), "
            "so it is never replaced",
            "move those files out, or point REPOSITORY_DIR at another directory",
        )


def check_destination(dest: Path, template_root: Path) -> None:
    if under_model_dir(dest):
        raise UsageError(
            f"refusing to write the model repository to {dest}: {contract.KSERVE_MODEL_DIR} is "
            "KServe's read-only model mount",
            "set REPOSITORY_DIR to a writable directory such as /tmp/model-repository",
        )
    if within(dest, template_root) or within(template_root, dest):
        raise UsageError(
            f"refusing to write the model repository to {dest}: it overlaps the templates at {template_root}",
            "set REPOSITORY_DIR to a directory outside TEMPLATES_DIR",
        )


def _copy_tree(source: Path, target: Path) -> None:
    """Copy a template model directory; copies are owner-writable even when the source is read-only."""
    target.mkdir(mode=0o755)
    for entry in sorted(source.iterdir()):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            _copy_tree(entry, target / entry.name)
        else:
            shutil.copyfile(entry, target / entry.name)
            os.chmod(target / entry.name, (entry.stat().st_mode & 0o777) | 0o600)


def plan_digest(plan: FillPlan, template_root: Path) -> str:
    """Names the repository a plan writes: same templates and values, same digest, so it can be reused."""
    # The copied template files (model.py …) count too: a new image on an old cache must not reuse old code.
    # By content, not mtime, so templates copied anew per pod still name the same repository.
    copied = sorted(
        (str(f.relative_to(template_root)), hashlib.sha256(f.read_bytes()).hexdigest())
        for m in plan.models
        for f in (template_root / m.source).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    )
    content = {
        "templates": str(template_root),
        "workflow": plan.workflow,
        "copied": copied,
        "models": [[m.source, m.name, sorted(m.files.items())] for m in plan.models],
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:20]


def _fill(plan: FillPlan, template_root: Path, log: Log) -> Callable[[Path], None]:
    def fill(staging: Path) -> None:
        for model in plan.models:
            _copy_tree(template_root / model.source, staging / model.name)
            for relative, text in model.files.items():
                target = staging / model.name / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        validate_repository(staging, log=log)

    return fill


def _problem(dest: Path, plan: FillPlan, template_root: Path, digest: str, log: Log | None) -> str | None:
    """Why `dest` may not be served as this plan's repository, or None. Served code comes only from the image: the
    stamp could have been rewritten along with a planted file, so every file is compared with what the image's
    templates and this plan write (see served_code) before the stamp is trusted."""
    if not dest.exists():
        return "absent"
    changed = served_code.changed_files(plan, template_root, dest, ignore=(STAMP,))
    if changed and log is not None:  # None: a first look without the lock, repeated under it
        log.warn(
            "the model repository differs from this image's templates; rebuilding it from the image",
            repository=dest,
            files=", ".join(changed),
        )
    if changed:
        return f"{', '.join(changed)} differ from this image's templates"
    problem = publish.problem(dest, STAMP, {"digest": digest})
    if problem is None:
        served_code.drop_bytecode(dest)  # the server compiles the checked sources anew
    return problem


def write_cached(plan: FillPlan, root: Path, template_root: Path, log: Log, *, timeout_s: float) -> tuple[Path, bool]:
    """The repository under `root` named by its content (CACHE_DIR/repositories/<digest>), written unless a valid
    copy is there; replicas on a shared cache take turns. (path, written now)."""
    template_root = Path(os.path.abspath(template_root))
    digest = plan_digest(plan, template_root)
    dest = Path(os.path.abspath(root)) / digest
    check_destination(dest, template_root)
    held = trust.renamable(dest.parent)
    reason = held or (trust.untrusted(dest) if dest.exists() else None)
    if reason is not None:  # another UID's copy could change after the check: this UID writes its own
        log.info("writing this UID's own model repository: another UID could change the shared one", because=reason)
        # Beside the shared one, unless another UID may move entries there too: then where it may not.
        dest = trust.private_root(dest.parent) / digest if held else dest.with_name(f"{digest}.uid{os.geteuid()}")
    if _problem(dest, plan, template_root, digest, None) is None:
        log.info("model repository up to date", repository=dest)
        return dest, False
    publish.sweep(dest.parent, log)
    with publish.locked(dest, timeout_s, log, "waiting for another process writing the model repository", LOCK_HINT):
        problem = _problem(dest, plan, template_root, digest, log)
        if problem is None:
            log.info("model repository up to date", repository=dest)
            return dest, False
        publish.remove_leftovers(dest, log)
        if dest.exists():  # everything under CACHE_DIR/repositories is ours; a damaged copy is rewritten
            publish.discard(dest, log, problem)
        publish.publish(dest, _fill(plan, template_root, log), {"digest": digest}, STAMP, log)
    return dest, True


def write_named(plan: FillPlan, dest: Path, template_root: Path, log: Log, *, timeout_s: float) -> int:
    """Write the repository to a directory the user named (REPOSITORY_DIR): absent, empty, or written by us before.

    Returns the descriptor of a shared lock on it, inheritable: the exec'd server keeps it while it serves, so a
    replica with the same settings reuses the repository and one with other settings fails instead of rewriting it.
    """
    dest = Path(os.path.abspath(dest))
    template_root = Path(os.path.abspath(template_root))
    check_destination(dest, template_root)
    digest = plan_digest(plan, template_root)
    dest.parent.mkdir(parents=True, exist_ok=True)
    lock = publish.lock_path(dest)
    fd = open_lock(lock)
    os.set_inheritable(fd, True)
    taken: list[int] = []

    def attempt() -> bool:  # exclusive: nobody serves or writes it; shared: only servers hold it
        for mode in (fcntl.LOCK_EX, fcntl.LOCK_SH):
            if publish.try_flock(fd, mode):
                taken.append(mode)
                return True
        return False

    try:
        publish.wait_for(
            fd, lock, timeout_s, log, "waiting for another process writing the model repository", LOCK_HINT, attempt
        )
        problem = _problem(dest, plan, template_root, digest, log)
        if taken == [fcntl.LOCK_SH] and problem is not None:
            raise EntrypointError(
                f"REPOSITORY_DIR={str(dest)!r} is served by another server "
                f"({publish.read_holder(fd)}) and differs from what these settings write ({problem})",
                "give each set of settings its own REPOSITORY_DIR, or leave it unset (the default "
                "is named by its content)",
            )
        if taken == [fcntl.LOCK_EX]:
            publish.write_holder(fd)
            publish.remove_leftovers(dest, log)
            if problem is not None and publish.is_ours(dest, STAMP):
                refuse_user_files(dest)  # again under the lock: preflight looked before it was taken
            if problem is not None:
                publish.publish(dest, _fill(plan, template_root, log), {"digest": digest}, STAMP, log)
            fcntl.flock(fd, fcntl.LOCK_SH)  # serving it now: replicas with the same content may join
        if problem is None:
            log.info("model repository up to date", repository=dest)
    except BaseException:
        os.close(fd)
        raise
    return fd
