"""Upstream source archives (GitHub tarballs): pinned by URL and sha256 in upstream.lock.json, downloaded into the
user cache and verified before anything reads them.

build.py takes the backend's templates, tools and examples from here for tags whose image lacks /app; the tests take
the backend templates and the KServe CRDs (the archives whose lock record has a `layout`). The cache,
$XDG_CACHE_HOME/trtllm-images (default ~/.cache/trtllm-images), holds:

    archives/<sha256>.tar.gz   an archive named by the digest of its bytes, renamed into place only after the digest
                               matched the lock and every member passed the safety checks
    layout/<key>/              the tests' upstream files, extracted from the pinned archives (the layout of a
                               TRTLLM_UPSTREAM_DIR copy)

Nothing here runs inside `docker build`: build contexts receive files that were already verified.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import posixpath
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import IO, cast

from packaging.version import InvalidVersion, Version

from trtllm_images.errors import BuildError, UsageError
from trtllm_images.files import publish_dir, write_atomic
from trtllm_images.matrix import DEFAULT_PATH

LOCK_PATH = DEFAULT_PATH.parent / "upstream.lock.json"
REFRESH = "python build.py upstream lock"
TARBALL_URL = "https://codeload.github.com/{repo}/tar.gz/{ref}"
NOT_RECORDED = f"not yet recorded: run `{REFRESH}` on a machine that reaches GitHub"
ALLOW_UNPINNED_FLAG = "--allow-unpinned"
TIMEOUT_SECS = 60  # per socket operation; bodies are streamed
CHUNK = 1 << 20
# Limits against a hostile or broken archive; GitHub's largest tarballs we use (TensorRT-LLM) are far below them.
MAX_ARCHIVE_BYTES = 4 << 30
MAX_UNPACKED_BYTES = 16 << 30
MAX_MEMBERS = 500_000
_SHA256_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Pin:
    """One archive: where it comes from and the sha256 of its bytes (None until recorded, with the reason)."""

    repo: str
    ref: str
    url: str
    sha256: str | None
    uncertain: str = ""
    # Path inside the archive (below GitHub's top directory) -> path in an upstream dir; only the tests' archives.
    layout: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def name(self) -> str:
        return f"{self.repo}@{self.ref}"

    def to_dict(self) -> dict:
        data: dict[str, object] = {"repo": self.repo, "ref": self.ref, "url": self.url, "sha256": self.sha256}
        if self.uncertain:
            data["uncertain"] = self.uncertain
        if self.layout:
            data["layout"] = dict(self.layout)
        return data


def new_pin(repo: str, ref: str) -> Pin:
    return Pin(repo, ref, TARBALL_URL.format(repo=repo, ref=ref), None, NOT_RECORDED)


@dataclass(frozen=True)
class Lock:
    pins: tuple[Pin, ...]
    path: Path = LOCK_PATH

    def pin(self, repo: str, ref: str) -> Pin:
        for pin in self.pins:
            if (pin.repo, pin.ref) == (repo, ref):
                return pin
        raise BuildError(
            f"{repo}@{ref} is not in {self.path.name}",
            f"run `{REFRESH}` on a machine that reaches GitHub: it adds every archive matrix.yaml needs",
        )

    def to_json(self) -> str:
        body = {"refresh": REFRESH, "archives": [pin.to_dict() for pin in self.pins]}
        return json.dumps(body, indent=2) + "\n"


def load_lock(path: Path = LOCK_PATH) -> Lock:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        pins = tuple(_pin(raw) for raw in data["archives"])
    except FileNotFoundError:
        raise UsageError(f"lock file {path} does not exist", f"run `{REFRESH}`") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is malformed: {exc}", f"restore it from git, then run `{REFRESH}`") from None
    return Lock(pins, path)


def _pin(raw: dict) -> Pin:
    sha256 = raw["sha256"]
    if sha256 is None and not raw.get("uncertain"):
        raise ValueError(f"{raw['repo']}@{raw['ref']}: a null sha256 needs an `uncertain` reason")
    if sha256 is not None and (len(sha256) != 64 or not set(sha256) <= _SHA256_CHARS):
        raise ValueError(f"{raw['repo']}@{raw['ref']}: sha256 {sha256!r} is not 64 lowercase hex digits")
    layout = raw.get("layout", {})
    if not all(_safe_relative(p) for p in (*layout, *layout.values())):
        raise ValueError(f"{raw['repo']}@{raw['ref']}: layout paths must be relative, without '..'")
    return Pin(raw["repo"], raw["ref"], raw["url"], sha256, raw.get("uncertain", ""), MappingProxyType(dict(layout)))


def _safe_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CACHE_HOME/trtllm-images; the XDG spec says a relative XDG_CACHE_HOME is to be ignored."""
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "trtllm-images"


# --- downloading and verifying one archive ---------------------------------------------------------------------------


def fetch(pin: Pin, cache: Path, *, local_copy: str, log: Callable[[str], None], allow_unpinned: bool = False) -> Path:
    """The verified archive file for `pin`, from the cache or downloaded. `local_copy` names what supplies the files
    without a download (it goes into the hint of every error)."""
    archives = Path(cache) / "archives"
    if pin.sha256 is None:
        if not allow_unpinned:
            raise BuildError(
                f"{pin.name} is not pinned: {pin.uncertain or 'no sha256 in ' + LOCK_PATH.name}",
                f"run `{REFRESH}` and commit {LOCK_PATH.name}; or supply {local_copy}; "
                f"or pass {ALLOW_UNPINNED_FLAG} to use it unverified",
            )
        log(f"warning: {pin.name} has no recorded sha256; using it unverified ({ALLOW_UNPINNED_FLAG})")
    else:
        cached = archives / f"{pin.sha256}.tar.gz"
        if cached.is_file():
            if file_sha256(cached) == pin.sha256:
                log(f"{pin.name}: verified archive in {cached}")
                return cached
            log(f"{pin.name}: {cached} no longer matches its name; downloading it again")
            cached.unlink()  # we wrote it under that name; its bytes changed since
    return download_verified(
        archives,
        pin.name,
        pin.url,
        pin.sha256,
        lambda digest: f"{digest}.tar.gz",
        log,
        hint=f"supply {local_copy}, or retry on a machine that reaches {_host(pin)}",
        mismatch_hint="the archive changed upstream (a moved tag) or on its way; nothing was cached. "
        f"If the change is intended: `{REFRESH} --repin {pin.name}`",
        check=lambda path: scan(path, pin.name),
    )


def download_verified(
    directory: Path,
    name: str,
    url: str,
    expected: str | None,
    file_name: Callable[[str], str],
    log: Callable[[str], None],
    *,
    hint: str,
    mismatch_hint: str,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Download `url` into `directory` as file_name(sha256), renamed into place only once its digest is `expected`
    (any digest when None) and `check` passed; a failure leaves no file behind."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=".download-", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            log(f"downloading {url}")
            actual = download(name, url, out, hint)
        if expected is not None and actual != expected:
            raise BuildError(f"{name}: sha256 mismatch for {url}: expected {expected}, got {actual}", mismatch_hint)
        if check is not None:
            check(tmp)
        final = directory / file_name(actual)
        os.replace(tmp, final)
        return final
    finally:
        tmp.unlink(missing_ok=True)


class _NotFound(BuildError):
    """HTTP 404: the ref does not exist upstream (refresh records that instead of failing)."""


def _host(pin: Pin) -> str:
    return urllib.parse.urlparse(pin.url).hostname or pin.url


def _download(pin: Pin, out: IO[bytes] | None, hint: str) -> str:
    """Stream pin.url into `out` (or nowhere); the sha256 of the body. A short body is an error, not an archive."""
    return download(pin.name, pin.url, out, hint)


def download(name: str, url: str, out: IO[bytes] | None, hint: str) -> str:
    """Stream `url` into `out` (or nowhere); the sha256 of the body. A short body is an error, not a file."""
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECS) as response:
            length = response.headers.get("Content-Length")
            while chunk := response.read(CHUNK):
                size += len(chunk)
                if size > MAX_ARCHIVE_BYTES:
                    raise BuildError(f"{name}: {url} is larger than {MAX_ARCHIVE_BYTES} bytes", hint)
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
    except urllib.error.HTTPError as exc:
        error = _NotFound if exc.code == 404 else BuildError
        raise error(f"cannot download {name} from {url}: HTTP {exc.code} {exc.reason}", hint) from None
    except urllib.error.URLError as exc:  # refused, DNS failure, timeout while connecting
        raise BuildError(f"cannot download {name} from {url} (offline?): {exc.reason}", hint) from None
    except (ConnectionError, TimeoutError, http.client.HTTPException) as exc:  # broke off mid-body
        raise BuildError(f"cannot download {name} from {url}: the connection broke: {exc!r}", hint) from None
    if length is not None and size != int(length):
        raise BuildError(
            f"cannot download {name} from {url}: the connection closed after {size} of {length} bytes", hint
        )
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        while chunk := data.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- reading archives safely -----------------------------------------------------------------------------------------


def scan(path: Path, name: str) -> None:
    """Read the whole archive once: a broken gzip/tar stream, an unsafe member or an archive past the size limits is
    one error. Nothing is written."""
    _walk(path, name, lambda tar, member, rel: None)


def extract(path: Path, name: str, members: Mapping[str, str], dest: Path) -> None:
    """Copy the archive entries under each key of `members` (paths below GitHub's top directory) to dest/<value>.
    Symlinks that would leave their kept tree, hard links and special files are not written."""

    def write(tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str) -> None:
        source = next((s for s in members if rel == s or rel.startswith(s + "/")), None)
        if source is None:
            return
        target = Path(dest) / (members[source] + rel[len(source) :])
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif member.isfile():
            target.parent.mkdir(parents=True, exist_ok=True)
            # A regular member always has data (extractfile returns None only for other kinds).
            with cast("IO[bytes]", tar.extractfile(member)) as data, open(target, "wb") as out:
                shutil.copyfileobj(data, out)
            target.chmod(0o755 if member.mode & 0o111 else 0o644)
        elif member.issym() and _link_stays_inside(rel, member.linkname, source):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(member.linkname)

    _walk(path, name, write)


def _walk(path: Path, name: str, visit: Callable[[tarfile.TarFile, tarfile.TarInfo, str], None]) -> None:
    count = unpacked = 0
    try:
        with gzip.open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                count += 1
                unpacked += max(member.size, 0)
                if count > MAX_MEMBERS or unpacked > MAX_UNPACKED_BYTES:
                    raise BuildError(
                        f"{name}: the archive unpacks to more than {MAX_MEMBERS} entries or {MAX_UNPACKED_BYTES} bytes",
                        "this is not a source tarball; check the URL",
                    )
                rel = _member_path(member, name)
                if rel:
                    visit(tar, member, rel)
            # tarfile stops at a short read as if the archive ended there; gzip's trailer (CRC, length) does not.
            while raw.read(CHUNK):
                pass
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BuildError(
            f"{name}: {path} is not a complete .tar.gz archive: {exc}",
            "a truncated or corrupt download; nothing was used. Retry",
        ) from None


def _member_path(member: tarfile.TarInfo, name: str) -> str:
    """The member's path below GitHub's "<repo>-<ref>/" top directory ("" for the top itself)."""
    if member.name.startswith("/") or ".." in PurePosixPath(member.name).parts:
        raise BuildError(f"{name}: unsafe path {member.name!r} in the archive", "this is not a GitHub source tarball")
    if not (member.isdir() or member.isfile() or member.issym() or member.islnk()):
        raise BuildError(f"{name}: special file {member.name!r} in the archive", "this is not a GitHub source tarball")
    return "/".join(PurePosixPath(member.name).parts[1:])


def _link_stays_inside(rel: str, linkname: str, root: str) -> bool:
    if posixpath.isabs(linkname):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), linkname))
    return resolved == root or resolved.startswith(root + "/")


# --- the tests' upstream files ---------------------------------------------------------------------------------------


def materialize_layout(lock: Lock, cache: Path, *, local_copy: str, log: Callable[[str], None]) -> Path:
    """An upstream dir (the layout of a TRTLLM_UPSTREAM_DIR copy) extracted from the pinned archives that have a
    `layout`; named by their digests, so a changed lock never reuses an old tree."""
    pins = [pin for pin in lock.pins if pin.layout]
    if not pins:
        raise BuildError(f"{lock.path.name} names no archive with a `layout`", "restore it from git")
    files = [fetch(pin, cache, local_copy=local_copy, log=log) for pin in pins]
    key = hashlib.sha256(json.dumps([[pin.sha256, dict(pin.layout)] for pin in pins]).encode()).hexdigest()[:16]
    final = Path(cache) / "layout" / key
    if final.is_dir():
        return final

    def fill(tmp: Path) -> None:
        for pin, archive in zip(pins, files, strict=True):
            extract(archive, pin.name, pin.layout, tmp)

    return publish_dir(final, fill)


# --- refreshing the lock ---------------------------------------------------------------------------------------------


def refresh(
    lock: Lock, wanted: Iterable[tuple[str, str]], *, repin: Iterable[str] = (), log: Callable[[str], None]
) -> Lock:
    """Download every archive that matrix.yaml needs (`wanted`) or that the tests use, and record its sha256.
    A recorded digest that no longer matches is an error unless its archive is named in `repin`."""
    repin = set(repin)
    by_key = {(pin.repo, pin.ref): pin for pin in lock.pins}
    keys = dict.fromkeys([*wanted, *(key for key, pin in by_key.items() if pin.layout)])
    unknown = repin - {f"{repo}@{ref}" for repo, ref in keys}
    if unknown:
        raise UsageError(
            f"--repin names no archive of the lock: {', '.join(sorted(unknown))}",
            "give repo@ref as printed by the mismatch error",
        )
    pins, problems = [], []
    for repo, ref in keys:
        old = by_key.get((repo, ref)) or new_pin(repo, ref)
        try:
            actual = _download(old, None, f"run it where {_host(old)} answers (the `upstream` workflow does)")
        except _NotFound:  # offline or any other failure propagates: refresh nothing rather than half
            if old.sha256:
                problems.append(f"{old.name}: {old.url} is gone (HTTP 404)")
            pins.append(old if old.sha256 else replace(old, uncertain=f"{old.url} answered HTTP 404: no such ref"))
            continue
        if old.sha256 in (None, actual) or old.name in repin:
            pins.append(replace(old, sha256=actual, uncertain=""))
            log(f"{old.name}: {actual}")
        else:
            problems.append(f"{old.name}: sha256 mismatch: expected {old.sha256}, got {actual}")
            pins.append(old)
    if problems:
        raise BuildError(
            f"{LOCK_PATH.name} left unchanged: " + "; ".join(problems),
            f"find out why the archive changed; to accept it: `{REFRESH} --repin REPO@REF`",
        )
    return Lock(tuple(sorted(pins, key=lambda p: (p.repo.lower(), _ref_order(p.ref)))), lock.path)


def _ref_order(ref: str) -> tuple:
    try:
        return (0, Version(ref.removeprefix("v")), ref)
    except InvalidVersion:
        return (1, Version("0"), ref)


def write_lock(lock: Lock) -> Path:
    return write_atomic(lock.path, lock.to_json().encode())
