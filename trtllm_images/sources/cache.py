"""The cache of verified upstream sources, $XDG_CACHE_HOME/trtllm-images (default ~/.cache/trtllm-images):

    sources/<digest hex>/   the pinned paths of one source, in the repository's layout, published by rename only
                            after their digest matched; checked again each time it is used
    trusted.json            the commit and digest of each source first fetched while the lock had none
    layout/<key>/           the tests' upstream files (the layout of a TRTLLM_UPSTREAM_DIR copy), made from the
                            verified sources and compared with them again each time it is used

`source(pin)` downloads a source's archive (safe_archive.py), extracts its pinned paths and checks them against the
committed lock (upstream.py), or, for a source not pinned there yet, against the user's own first fetch (trust on first
use, as ssh does with host keys). `materialize_layout` builds the tests' upstream files from those sources. Nothing
here runs inside `docker build`: build contexts receive files that were already verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtllm_entrypoint.errors import Error
from trtllm_images.atomic import publish_dir, write_atomic
from trtllm_images.sources import archive as safe_archive
from trtllm_images.sources import tree as source_tree
from trtllm_images.sources.upstream import FROM_GIT, LOCK_PATH, REFRESH, REQUIRE_PINNED_FLAG, Lock, Pin

TRUST_FILE = "trusted.json"


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CACHE_HOME/trtllm-images; the XDG spec says a relative XDG_CACHE_HOME is to be ignored."""
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "trtllm-images"


@dataclass(frozen=True)
class _Expected:
    commit: str | None
    digest: str
    where: str  # the lock, or the trust file


def source(pin: Pin, cache: Path, *, local_copy: str, log: Callable[[str], None], require_pinned: bool = False) -> Path:
    """A directory holding `pin.paths` of the repository at pin.ref, verified by content: from the cache, or
    downloaded. `local_copy` names what supplies the files without a download (it goes into each error's hint)."""
    cache = Path(cache)
    expected = _expected(pin, cache, require_pinned)
    if expected is not None:
        cached = cache / "sources" / expected.digest.removeprefix(source_tree.PREFIX)
        if cached.is_dir():
            if source_tree.from_directory(cached) == expected.digest:
                return cached
            log(f"{pin.name}: {cached} no longer matches its digest; fetching it again")
            shutil.rmtree(cached)  # we published it under that name; its content changed since
    hint = f"supply {local_copy}, or retry on a machine that reaches {pin.host}"
    with tempfile.TemporaryDirectory(dir=_mkdir(cache / "sources"), prefix=".fetch-") as scratch:
        archive = Path(scratch) / "archive"
        log(f"downloading {pin.url}")
        safe_archive.download(pin.name, pin.url, archive, hint)
        tree = Path(scratch) / "tree"
        commit, digest = safe_archive.extract(archive, pin.name, pin.paths, tree)
        archive.unlink()
        if expected is None:
            _trust(cache, pin, commit, digest, log)
        else:
            _check(pin, expected, commit, digest)
        final = cache / "sources" / digest.removeprefix(source_tree.PREFIX)
        if final.is_dir() and source_tree.from_directory(final) != digest:
            shutil.rmtree(final)  # ours, changed since: publish_dir would keep it
        return publish_dir(final, lambda tmp: _move(tree, tmp))


def _expected(pin: Pin, cache: Path, require_pinned: bool) -> _Expected | None:
    if pin.digest is not None:
        return _Expected(pin.commit, pin.digest, LOCK_PATH.name)
    if require_pinned:
        raise Error(
            f"{pin.name} is not pinned in {LOCK_PATH.name} ({pin.uncertain}), and {REQUIRE_PINNED_FLAG} takes "
            "only what the committed lock pins",
            f"run `{FROM_GIT}` with a clone of {pin.repo}, or `{REFRESH}` where GitHub answers, and commit the lock",
        )
    record = _trusted(cache).get(pin.name)
    if record and record.get("paths") == list(pin.paths):
        return _Expected(record["commit"], record["digest"], str(cache / TRUST_FILE))
    return None


def _check(pin: Pin, expected: _Expected, commit: str | None, digest: str) -> None:
    if digest != expected.digest:
        what, want, got = f"content of {', '.join(pin.paths)}", expected.digest, digest
    elif expected.commit and commit and commit != expected.commit:
        what, want, got = "commit", expected.commit, commit
    else:
        return
    raise Error(
        f"{pin.name}: the {what} differs from {expected.where}: expected {want}, got {got}",
        "the ref moved upstream or the download was altered; nothing was kept. If the change is intended: "
        + (
            f"`{REFRESH} --repin {pin.name}`"
            if expected.where == LOCK_PATH.name
            else f"remove its record from {expected.where}"
        ),
    )


def _trusted(cache: Path) -> dict[str, dict]:
    """The trust-on-first-use records; a damaged file is an error, never an empty trust store."""
    path = cache / TRUST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not all(_trust_record(record) for record in data.values()):
            raise ValueError("each record needs a tree1 digest, a commit or null, and its paths")
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise Error(f"{path} is malformed: {exc}", "delete it; the next fetch trusts again") from None
    return data


def _trust_record(record: object) -> bool:
    return (
        isinstance(record, dict)
        and source_tree.is_digest(record.get("digest"))
        and (record.get("commit") is None or source_tree.is_commit(record.get("commit")))
        and isinstance(record.get("paths"), list)
    )


def _trust(cache: Path, pin: Pin, commit: str | None, digest: str, log: Callable[[str], None]) -> None:
    records = _trusted(cache)
    records[pin.name] = {"commit": commit, "digest": digest, "paths": list(pin.paths), "url": pin.url}
    path = write_atomic(cache / TRUST_FILE, (json.dumps(records, indent=2, sort_keys=True) + "\n").encode())
    log(
        f"trust on first use: {pin.name} is not pinned in {LOCK_PATH.name}; recorded commit {commit or 'unknown'} "
        f"and {digest} in {path}, which later fetches must match"
    )


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _move(tree: Path, dest: Path) -> None:
    for child in tree.iterdir():
        child.rename(dest / child.name)


def covers(pin: Pin, needs: Sequence[str]) -> bool:
    """Whether `pin` lays out any of `needs` (paths in the layout: a file, or a directory above or below its own)."""
    dests = [dest.rstrip("/") for dest in pin.layout.values()]
    wanted = [need.rstrip("/") for need in needs]
    return any(d == w or d.startswith(w + "/") or w.startswith(d + "/") for d in dests for w in wanted)


def materialize_layout(
    lock: Lock, cache: Path, *, local_copy: str, log: Callable[[str], None], needs: Sequence[str] = ()
) -> Path:
    """An upstream dir (the layout of a TRTLLM_UPSTREAM_DIR copy) from the sources that have a `layout`: pinned
    ones verified against the lock, the others trusted on first use. Named by their digests, so a changed source
    never reuses an old tree. With `needs` (paths in the layout), only the sources that lay them out: a stand-in
    for one tag downloads its templates, not every CRD."""
    pins = [pin for pin in lock.pins if pin.layout and (not needs or covers(pin, needs))]
    if not pins:
        what = f"no source with a `layout` holding {', '.join(needs)}" if needs else "no source with a `layout`"
        raise Error(f"{lock.path.name} names {what}", "restore it from git")
    trees = [source(pin, cache, local_copy=local_copy, log=log) for pin in pins]
    layouts = [[tree.name, dict(pin.layout)] for pin, tree in zip(pins, trees, strict=True)]
    key = hashlib.sha256(json.dumps(layouts, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(cache) / "layout" / key

    def fill(tmp: Path) -> None:
        for pin, tree in zip(pins, trees, strict=True):
            safe_archive.copy_members(tree, pin.layout, tmp, pin.name, log)

    if not final.is_dir():
        return publish_dir(final, fill)
    # Checked at each use, as sources/ is: against the tree its verified sources give now (a few template files).
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.check-") as scratch:
        fill(Path(scratch))
        if source_tree.from_directory(Path(scratch)) == source_tree.from_directory(final):
            return final
    log(f"{final} differs from what its verified sources give; building it again")
    return publish_dir(final, fill, replace=True)
