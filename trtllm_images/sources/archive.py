"""Downloading an archive and reading it safely: any tar compression, told apart by its magic bytes; only the members
under the paths asked for are written, never through a link, with every link resolved inside the destination; size and
member limits against a hostile or broken archive; copying parts of an extracted tree without the links that leave
them. Knows nothing of the lock: source_cache.py and upstream.py hand it names, URLs and paths.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import http.client
import lzma
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, cast

from trtllm_entrypoint.errors import Error
from trtllm_images.sources import tree as source_tree

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


class NotFound(Error):
    """HTTP 404: the ref does not exist upstream (refresh records that instead of failing)."""


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
        error = NotFound if exc.code == 404 else Error
        raise error(f"cannot download {name} from {url}: HTTP {exc.code} {exc.reason}", hint) from None
    except urllib.error.URLError as exc:  # refused, DNS failure, timeout while connecting
        raise Error(f"cannot download {name} from {url} (offline?): {exc.reason}", hint) from None
    except (ConnectionError, TimeoutError, http.client.HTTPException) as exc:  # broke off mid-body
        raise Error(f"cannot download {name} from {url}: the connection broke: {exc!r}", hint) from None
    if length is not None and size != int(length):
        raise Error(f"cannot download {name} from {url}: the connection closed after {size} of {length} bytes", hint)


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
