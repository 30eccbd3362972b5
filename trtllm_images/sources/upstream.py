"""The lock of upstream sources (GitHub repositories at matrix refs), upstream.lock.json: each pinned by what we use
of it, the commit the ref resolved to and the content digest (`source_tree`) of the files under the pinned paths;
loading it, merging in what the matrix and the tests need, refreshing it from downloads or a git clone, writing it.

build.py takes the backend's templates, tools and examples from these sources for tags whose image lacks /app; the
tests take the backend templates and the KServe CRDs (the sources whose record has a `layout`). source_cache.py fetches
and verifies them, safe_archive.py reads their archives.
"""

from __future__ import annotations

import json
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from packaging.version import InvalidVersion, Version

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images.atomic import write_atomic
from trtllm_images.matrix import DEFAULT_PATH
from trtllm_images.sources import archive as safe_archive
from trtllm_images.sources import tree as source_tree

LOCK_PATH = DEFAULT_PATH.parent / "upstream.lock.json"
REFRESH = "python build.py upstream lock"
FROM_GIT = f"{REFRESH} --from-git DIR"
TARBALL_URL = "https://codeload.github.com/{repo}/tar.gz/{ref}"
NOT_RECORDED = f"not yet recorded: run `{FROM_GIT}` with a clone, or `{REFRESH}` where GitHub answers"
REQUIRE_PINNED_FLAG = "--require-pinned"


@dataclass(frozen=True)
class Pin:
    """One source: repo@ref, where its archive is, the paths we take from it, and what they must be (commit and
    digest; None until recorded, with the reason in `uncertain`)."""

    repo: str
    ref: str
    url: str
    paths: tuple[str, ...]
    commit: str | None = None
    digest: str | None = None
    uncertain: str = ""
    # Path in the repository -> path in an upstream dir; only the tests' sources.
    layout: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def name(self) -> str:
        return f"{self.repo}@{self.ref}"

    @property
    def host(self) -> str:
        return urllib.parse.urlparse(self.url).hostname or self.url

    def to_dict(self) -> dict:
        data: dict[str, object] = {"repo": self.repo, "ref": self.ref, "url": self.url, "paths": list(self.paths)}
        data |= {"commit": self.commit, "digest": self.digest}
        if self.uncertain:
            data["uncertain"] = self.uncertain
        if self.layout:
            data["layout"] = dict(self.layout)
        return data


def new_pin(repo: str, ref: str, paths: Iterable[str]) -> Pin:
    url = TARBALL_URL.format(repo=repo, ref=ref)
    return Pin(repo, ref, url, source_tree.normalize_paths(paths), uncertain=NOT_RECORDED)


@dataclass(frozen=True)
class Lock:
    pins: tuple[Pin, ...]
    path: Path = LOCK_PATH

    def pin(self, repo: str, ref: str) -> Pin:
        for pin in self.pins:
            if (pin.repo, pin.ref) == (repo, ref):
                return pin
        raise Error(
            f"{repo}@{ref} is not in {self.path.name}",
            f"run `{REFRESH}`: it adds every source matrix.yaml needs",
        )

    def to_json(self) -> str:
        body = {
            "refresh": f"{REFRESH}  (or: {FROM_GIT} --repo OWNER/NAME)",
            "digest": f"{source_tree.PREFIX} defined in trtllm_images/sources/tree.py",
            "sources": [pin.to_dict() for pin in self.pins],
        }
        return json.dumps(body, indent=2) + "\n"


def load_lock(path: Path = LOCK_PATH) -> Lock:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        pins = tuple(_pin(raw) for raw in data["sources"])
    except FileNotFoundError:
        raise UsageError(f"lock file {path} does not exist", f"run `{REFRESH}`") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path} is malformed: {exc}", f"restore it from git, then run `{REFRESH}`") from None
    return Lock(pins, path)


def _pin(raw: dict) -> Pin:
    name = f"{raw['repo']}@{raw['ref']}"
    commit, digest = raw.get("commit"), raw.get("digest")
    if digest is None and not raw.get("uncertain"):
        raise ValueError(f"{name}: a null digest needs an `uncertain` reason")
    if digest is not None and not source_tree.is_digest(digest):
        raise ValueError(f"{name}: digest {digest!r} is not {source_tree.PREFIX} and 64 lowercase hex digits")
    if commit is not None and not source_tree.is_commit(commit):
        raise ValueError(f"{name}: commit {commit!r} is not 40 lowercase hex digits")
    paths, layout = raw["paths"], raw.get("layout", {})
    if not paths or not all(source_tree.safe_relative(p) for p in (*paths, *layout, *layout.values())):
        raise ValueError(f"{name}: paths and layout must be relative, without '..' or '.'")
    if not all(source_tree.under(p, paths) for p in layout):
        raise ValueError(f"{name}: every layout path must lie under one of its `paths`")
    return Pin(
        raw["repo"],
        raw["ref"],
        raw["url"],
        source_tree.normalize_paths(paths),
        commit,
        digest,
        raw.get("uncertain", ""),
        MappingProxyType(dict(layout)),
    )


def covering(pin: Pin, members: Iterable[str]) -> None:
    missing = [m for m in members if not source_tree.under(m, pin.paths)]
    if missing:
        raise Error(
            f"{pin.name}: {LOCK_PATH.name} does not pin {', '.join(missing)}",
            f"run `{REFRESH}` (or `{FROM_GIT}`) so that its `paths` cover them",
        )


def merge(lock: Lock, wanted: Mapping[tuple[str, str], Iterable[str]]) -> Lock:
    """The lock's records for what the matrix needs (`wanted`: (repo, ref) -> paths) and the tests' sources. A record
    whose paths changed loses its digest (it described other files). Pure."""
    by_key = {(pin.repo, pin.ref): pin for pin in lock.pins}
    keys = dict.fromkeys([*wanted, *(key for key, pin in by_key.items() if pin.layout)])
    pins = []
    for repo, ref in keys:
        old = by_key.get((repo, ref))
        paths = source_tree.normalize_paths([*wanted.get((repo, ref), ()), *(old.layout if old else ())])
        if old is None:
            pins.append(new_pin(repo, ref, paths))
        elif old.paths != paths:
            pins.append(replace(old, paths=paths, commit=None, digest=None, uncertain=NOT_RECORDED))
        else:
            pins.append(old)
    return Lock(tuple(sorted(pins, key=lambda p: (p.repo.lower(), _ref_order(p.ref)))), lock.path)


def refresh(lock: Lock, *, repin: Iterable[str] = (), log: Callable[[str], None]) -> Lock:
    """Download every source of the lock and record its commit and digest. A recorded digest that no longer matches
    is an error unless its source is named in `repin`."""
    repin = _check_repin(lock, repin)

    def measure(pin: Pin) -> tuple[str | None, str] | None:
        with tempfile.TemporaryDirectory(prefix="trtllm-images-lock-") as scratch:
            try:
                safe_archive.download(pin.name, pin.url, Path(scratch) / "archive", f"run it where {pin.host} answers")
            except safe_archive.NotFound:  # offline or any other failure propagates: refresh nothing rather than half
                return None
            return safe_archive.extract(Path(scratch) / "archive", pin.name, pin.paths, Path(scratch) / "tree")

    return _record(lock, lock.pins, measure, repin, log)


def refresh_from_git(
    lock: Lock, repo: str, directory: Path, *, repin: Iterable[str] = (), log: Callable[[str], None]
) -> Lock:
    """Record commit and digest of every source of `repo` from a git clone or mirror of it, from git objects alone.
    Refs the clone lacks are left as they were."""
    repin = _check_repin(lock, repin)
    pins = [pin for pin in lock.pins if pin.repo == repo]
    if not pins:
        raise UsageError(f"{lock.path.name} has no source of {repo}", "give --repo as OWNER/NAME, as in the lock")

    def measure(pin: Pin) -> tuple[str | None, str] | None:
        try:
            found = source_tree.from_git(directory, pin.ref, pin.paths)
        except UsageError as exc:
            log(f"{pin.name}: left as it was ({exc.message})")
            return "", ""  # nothing to record
        return found.commit, found.digest

    return _record(lock, pins, measure, repin, log)


def relock(
    lock: Lock, *, repin: Iterable[str], git_dir: Path | None, repo: str | None, log: Callable[[str], None]
) -> Lock:
    """`build.py upstream lock`: refreshed from GitHub archives, or with `git_dir` from the objects of a clone of
    `repo` (default: the clone's remote.origin.url)."""
    if git_dir is None:
        if repo:
            raise UsageError("--repo applies only with --from-git", "add --from-git DIR, or drop --repo")
        return refresh(lock, repin=repin, log=log)
    return refresh_from_git(lock, repo or source_tree.origin_repo(git_dir), git_dir, repin=repin, log=log)


def _check_repin(lock: Lock, repin: Iterable[str]) -> set[str]:
    repin = set(repin)
    unknown = repin - {pin.name for pin in lock.pins}
    if unknown:
        raise UsageError(
            f"--repin names no source of the lock: {', '.join(sorted(unknown))}",
            "give repo@ref as printed by the mismatch error",
        )
    return repin


def _record(
    lock: Lock,
    pins: Iterable[Pin],
    measure: Callable[[Pin], tuple[str | None, str] | None],
    repin: set[str],
    log: Callable[[str], None],
) -> Lock:
    updated, problems = {}, []
    for pin in pins:
        found = measure(pin)
        if found is None:
            if pin.digest:
                problems.append(f"{pin.name}: {pin.url} is gone (HTTP 404)")
            else:
                updated[pin.name] = replace(pin, uncertain=f"{pin.url} answered HTTP 404: no such ref")
            continue
        commit, digest = found
        if not digest:
            continue
        changed = pin.digest not in (None, digest) or (pin.commit and commit and pin.commit != commit)
        if changed and pin.name not in repin:
            problems.append(f"{pin.name}: expected {pin.commit} {pin.digest}, got {commit} {digest}")
            continue
        updated[pin.name] = replace(pin, commit=commit, digest=digest, uncertain="")
        log(f"{pin.name}: {commit} {digest}")
    if problems:
        raise Error(
            f"{lock.path.name} left unchanged: " + "; ".join(problems),
            f"find out why the source changed; to accept it: `{REFRESH} --repin REPO@REF`",
        )
    return replace(lock, pins=tuple(updated.get(pin.name, pin) for pin in lock.pins))


def _ref_order(ref: str) -> tuple:
    try:
        return (0, Version(ref.removeprefix("v")), ref)
    except InvalidVersion:
        return (1, Version("0"), ref)


def write_lock(lock: Lock) -> Path:
    return write_atomic(lock.path, lock.to_json().encode())
