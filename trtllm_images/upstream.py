"""Upstream sources (GitHub repositories at matrix refs), pinned in upstream.lock.json by what we use of them: the
commit the ref resolved to and the content digest (`source_tree`) of the files under the pinned paths.

build.py takes the backend's templates, tools and examples from here for tags whose image lacks /app; the tests take
the backend templates and the KServe CRDs (the sources whose lock record has a `layout`). A source is downloaded as
GitHub's archive (any tar compression), extracted safely, and verified by content; its record comes from the
committed lock, or, for a source not pinned there yet, from the user's own first fetch (trust on first use, as ssh
does with host keys). The cache, $XDG_CACHE_HOME/trtllm-images (default ~/.cache/trtllm-images), holds:

    sources/<digest hex>/   the pinned paths of one source, in the repository's layout, published by rename only
                            after their digest matched; checked again each time it is used
    trusted.json            the commit and digest of each source first fetched while the lock had none
    layout/<key>/           the tests' upstream files (the layout of a TRTLLM_UPSTREAM_DIR copy), made from the
                            verified sources and compared with them again each time it is used

Nothing here runs inside `docker build`: build contexts receive files that were already verified.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import http.client
import json
import lzma
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import IO, cast

from packaging.version import InvalidVersion, Version

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import source_tree
from trtllm_images.atomic import publish_dir, write_atomic
from trtllm_images.matrix import DEFAULT_PATH

LOCK_PATH = DEFAULT_PATH.parent / "upstream.lock.json"
REFRESH = "python build.py upstream lock"
FROM_GIT = f"{REFRESH} --from-git DIR"
TARBALL_URL = "https://codeload.github.com/{repo}/tar.gz/{ref}"
NOT_RECORDED = f"not yet recorded: run `{FROM_GIT}` with a clone, or `{REFRESH}` where GitHub answers"
REQUIRE_PINNED_FLAG = "--require-pinned"
TRUST_FILE = "trusted.json"
TIMEOUT_SECS = 60  # per socket operation; bodies are streamed
CHUNK = 1 << 20
# Limits against a hostile or broken archive; GitHub's largest archives we use (TensorRT-LLM) are far below them.
MAX_ARCHIVE_BYTES = 4 << 30
MAX_UNPACKED_BYTES = 16 << 30
MAX_MEMBERS = 500_000
# Compressions told apart by their magic bytes; each module checks its stream's trailer, so a cut-off one is an error.
_COMPRESSIONS: tuple[tuple[bytes, Callable[[str], IO[bytes]]], ...] = (
    (b"\x1f\x8b", lambda p: cast("IO[bytes]", gzip.GzipFile(p, "rb"))),
    (b"BZh", lambda p: cast("IO[bytes]", bz2.BZ2File(p, "rb"))),
    (b"\xfd7zXZ\x00", lambda p: cast("IO[bytes]", lzma.LZMAFile(p, "rb"))),  # noqa: SIM115 (caller closes)
)


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
            "digest": f"{source_tree.PREFIX} defined in trtllm_images/source_tree.py",
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


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CACHE_HOME/trtllm-images; the XDG spec says a relative XDG_CACHE_HOME is to be ignored."""
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "trtllm-images"


# --- one verified source ---------------------------------------------------------------------------------------


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
    hint = f"supply {local_copy}, or retry on a machine that reaches {_host(pin)}"
    with tempfile.TemporaryDirectory(dir=_mkdir(cache / "sources"), prefix=".fetch-") as scratch:
        archive = Path(scratch) / "archive"
        log(f"downloading {pin.url}")
        _download(pin, archive, hint)
        tree = Path(scratch) / "tree"
        commit, digest = extract(archive, pin.name, pin.paths, tree)
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


def _host(pin: Pin) -> str:
    return urllib.parse.urlparse(pin.url).hostname or pin.url


class _NotFound(Error):
    """HTTP 404: the ref does not exist upstream (refresh records that instead of failing)."""


def _download(pin: Pin, dest: Path, hint: str) -> None:
    """Stream pin.url into `dest`. A body shorter than its Content-Length is an error, not an archive."""
    download(pin.name, pin.url, dest, hint)


def download(name: str, url: str, dest: Path, hint: str) -> None:
    """Stream `url` into `dest`. A body shorter than its Content-Length is an error, not a file."""
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECS) as response, open(dest, "wb") as out:
            length = response.headers.get("Content-Length")
            while chunk := response.read(CHUNK):
                size += len(chunk)
                if size > MAX_ARCHIVE_BYTES:
                    raise Error(f"{name}: {url} is larger than {MAX_ARCHIVE_BYTES} bytes", hint)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        error = _NotFound if exc.code == 404 else Error
        raise error(f"cannot download {name} from {url}: HTTP {exc.code} {exc.reason}", hint) from None
    except urllib.error.URLError as exc:  # refused, DNS failure, timeout while connecting
        raise Error(f"cannot download {name} from {url} (offline?): {exc.reason}", hint) from None
    except (ConnectionError, TimeoutError, http.client.HTTPException) as exc:  # broke off mid-body
        raise Error(f"cannot download {name} from {url}: the connection broke: {exc!r}", hint) from None
    if length is not None and size != int(length):
        raise Error(f"cannot download {name} from {url}: the connection closed after {size} of {length} bytes", hint)


# --- reading archives safely -----------------------------------------------------------------------------------


def extract(archive: Path, name: str, paths: Iterable[str], dest: Path) -> tuple[str | None, str]:
    """Write the members under `paths` (repository paths, below the archive's one top directory) into `dest`, a new
    directory; return the commit the archive names (git's pax header) and the digest of what was written.

    Nothing is ever written through a symlink. Before each write, the member's final path is resolved on disk,
    through the links already written: its directory must resolve to itself inside `dest`, and its own name must not
    exist yet (no path twice, no member below a symlink or a file). Once all are written, every symlink is resolved
    as the OS would, through every other link: one that leaves `dest` refuses the whole archive, as do absolute
    links, hard links and special files."""
    paths = source_tree.normalize_paths(paths)
    dest = Path(dest)
    dest.mkdir()
    root = Path(os.path.realpath(dest))
    kinds: dict[str, str] = {}  # path -> "dir", "file" or "link"
    entries: list[source_tree.Entry] = []
    state = {"count": 0, "unpacked": 0, "top": None}

    def refuse(member: str, why: str) -> Error:
        return Error(f"{name}: {why}: {member!r} in the archive", "this is not a source archive; nothing was kept")

    with _open(archive, name) as tar:
        for member in tar:
            rel = _member_path(member, name, state, refuse)
            if not rel or not source_tree.under(rel, paths):
                continue
            kind = "dir" if member.isdir() else "link" if member.issym() else "file"
            if rel in kinds and not (kind == kinds[rel] == "dir"):
                raise refuse(member.name, "a path given twice")
            parents = ["/".join(rel.split("/")[:i]) for i in range(1, rel.count("/") + 1)]
            if any(kinds.get(parent, "dir") != "dir" for parent in parents):
                raise refuse(member.name, "a member below a symlink or a file")
            target = root / rel
            if os.path.realpath(target.parent) != str(target.parent):
                raise refuse(member.name, "a member whose directory resolves elsewhere")
            kinds.update({parent: "dir" for parent in parents})  # created below, if not yet there
            kinds[rel] = kind
            target.parent.mkdir(parents=True, exist_ok=True)
            if kind == "dir":
                target.mkdir(exist_ok=True)
            elif kind == "link":
                if os.path.isabs(member.linkname) or not member.linkname:
                    raise refuse(member.name, f"an absolute or empty symlink (to {member.linkname!r})")
                os.symlink(member.linkname, target)
                entries.append(source_tree.entry(rel, source_tree.SYMLINK, member.linkname.encode()))
            else:
                entries.append(_write_file(tar, member, rel, target))
        commit = tar.pax_headers.get("comment")
    for rel, kind in kinds.items():
        if kind == "link" and not _inside(os.path.realpath(root / rel), root):
            raise refuse(
                rel, f"a symlink that resolves outside the extraction directory (to {os.readlink(root / rel)!r})"
            )
    if not entries:
        raise Error(
            f"{name}: the archive has nothing under {', '.join(paths)}", "check the ref and the paths in the lock"
        )
    return (commit if source_tree.is_commit(commit) else None), source_tree.digest(entries)


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str, target: Path) -> source_tree.Entry:
    """A new file (never through a symlink, never over anything), hashed as it is written."""
    executable = bool(member.mode & 0o100)
    digest = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with cast("IO[bytes]", tar.extractfile(member)) as data, os.fdopen(fd, "wb") as out:  # a regular member has data
        while chunk := data.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
        os.fchmod(out.fileno(), 0o755 if executable else 0o644)  # the umask must not decide the exec bit
    mode = source_tree.EXECUTABLE if executable else source_tree.REGULAR
    return source_tree.Entry(rel, mode, digest.hexdigest())


def _inside(path: str, root: Path) -> bool:
    return path == str(root) or path.startswith(str(root) + os.sep)


@contextlib.contextmanager
def _open(archive: Path, name: str) -> Iterator[tarfile.TarFile]:
    """The archive as a stream of tar members, decompressed by what its first bytes say. After the caller's loop the
    rest of the stream is read: a cut-off compressed stream, whose tar part may look complete, is an error then."""
    with open(archive, "rb") as head:
        magic = head.read(6)
    opener = next((open_ for prefix, open_ in _COMPRESSIONS if magic.startswith(prefix)), _plain)
    try:
        with opener(str(archive)) as raw:
            yield tarfile.open(fileobj=raw, mode="r|")  # noqa: SIM115 (closed with `raw`)
            while raw.read(CHUNK):
                pass
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:  # the disk, not the data
            raise
        raise Error(
            f"{name}: {archive.name} is not a complete tar archive (plain, gzip, bzip2 or xz): {exc}",
            "a truncated or corrupt download; nothing was kept. Retry",
        ) from None


def _plain(path: str) -> IO[bytes]:
    return open(path, "rb")


def _member_path(member: tarfile.TarInfo, name: str, state: dict, refuse: Callable[[str, str], Error]) -> str:
    """The member's path below the archive's one top directory ("" for the top itself), after the checks that
    apply to every member, kept or not."""
    state["count"] += 1
    state["unpacked"] += max(member.size, 0)
    if state["count"] > MAX_MEMBERS or state["unpacked"] > MAX_UNPACKED_BYTES:
        raise Error(
            f"{name}: the archive unpacks to more than {MAX_MEMBERS} entries or {MAX_UNPACKED_BYTES} bytes",
            "this is not a source archive; check the URL",
        )
    parts = member.name.split("/")
    if member.name.startswith("/") or ".." in parts:
        raise refuse(member.name, "an unsafe path")
    if not (member.isdir() or member.isfile() or member.issym()):
        raise refuse(member.name, "a hard link or special file")
    parts = [part for part in parts if part not in ("", ".")]
    if not parts:
        return ""
    if state["top"] is None:
        state["top"] = parts[0]
    elif parts[0] != state["top"]:
        raise refuse(member.name, f"a member outside the top directory {state['top']!r}")
    return "/".join(parts[1:])


# --- copying parts of a source ---------------------------------------------------------------------------------


def copy_members(tree: Path, members: Mapping[str, str], dest: Path, name: str, log: Callable[[str], None]) -> None:
    """Copy tree/<source> to dest/<target> for each member. A symlink is copied only when it resolves inside the
    member it belongs to (a template set must not point into the rest of the repository, or the host)."""
    for source, target in members.items():
        top = tree / source
        if top.is_symlink() or not top.exists():
            continue  # a member the ref lacks (the lock's paths cover every ref's layout), or a link as a whole
        if top.is_file():
            _copy_entry(top, dest / target)
            continue
        base = Path(os.path.realpath(top))
        for here, dirs, files in os.walk(top):
            for entry in sorted([*dirs, *files]):
                path = Path(here) / entry
                out = dest / target / path.relative_to(top)
                if path.is_symlink() and not _inside(os.path.realpath(path), base):
                    log(f"{name}: not copying {source}/{path.relative_to(top)}: its link leaves {source}")
                    continue
                _copy_entry(path, out)


def _copy_entry(path: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        os.symlink(os.readlink(path), out)
    elif path.is_dir():
        out.mkdir(exist_ok=True)
    else:
        shutil.copy2(path, out, follow_symlinks=False)


def covering(pin: Pin, members: Iterable[str]) -> None:
    missing = [m for m in members if not source_tree.under(m, pin.paths)]
    if missing:
        raise Error(
            f"{pin.name}: {LOCK_PATH.name} does not pin {', '.join(missing)}",
            f"run `{REFRESH}` (or `{FROM_GIT}`) so that its `paths` cover them",
        )


# --- the tests' upstream files ---------------------------------------------------------------------------------


def materialize_layout(lock: Lock, cache: Path, *, local_copy: str, log: Callable[[str], None]) -> Path:
    """An upstream dir (the layout of a TRTLLM_UPSTREAM_DIR copy) from the sources that have a `layout`: pinned
    ones verified against the lock, the others trusted on first use. Named by their digests, so a changed source
    never reuses an old tree."""
    pins = [pin for pin in lock.pins if pin.layout]
    if not pins:
        raise Error(f"{lock.path.name} names no source with a `layout`", "restore it from git")
    trees = [source(pin, cache, local_copy=local_copy, log=log) for pin in pins]
    layouts = [[tree.name, dict(pin.layout)] for pin, tree in zip(pins, trees, strict=True)]
    key = hashlib.sha256(json.dumps(layouts, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(cache) / "layout" / key

    def fill(tmp: Path) -> None:
        for pin, tree in zip(pins, trees, strict=True):
            copy_members(tree, pin.layout, tmp, pin.name, log)

    if not final.is_dir():
        return publish_dir(final, fill)
    # Checked at each use, as sources/ is: against the tree its verified sources give now (a few template files).
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{final.name}.check-") as scratch:
        fill(Path(scratch))
        if source_tree.from_directory(Path(scratch)) == source_tree.from_directory(final):
            return final
    log(f"{final} differs from what its verified sources give; building it again")
    return publish_dir(final, fill, replace=True)


# --- refreshing the lock ---------------------------------------------------------------------------------------


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
                _download(pin, Path(scratch) / "archive", f"run it where {_host(pin)} answers")
            except _NotFound:  # offline or any other failure propagates: refresh nothing rather than half
                return None
            return extract(Path(scratch) / "archive", pin.name, pin.paths, Path(scratch) / "tree")

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
