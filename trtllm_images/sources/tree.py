"""The content digest of what we take from an upstream repository, and how to compute it from git objects.

"tree1:<hex>" is the sha256 of one line per file or symlink under the pinned paths, sorted by path (UTF-8 bytes):

    <mode> <sha256 of the content> <path>\\n

where mode is git's (100644 regular, 100755 executable, 120000 symlink, whose content is its target) and path is
relative to the repository root. Directories count only through what they hold: git records no empty directory, and a
submodule is an empty directory in an archive. The digest describes what `git archive` of the commit writes (what
GitHub serves as a source archive): files marked `export-ignore` in .gitattributes, or below a directory so marked,
are absent, and `export-subst` files hold their expanded `$Format:…$` placeholders. So a downloaded archive, whatever
its compression, tar metadata (mtimes, owners, pax headers) or top directory, and a walk of the git tree give the same
value (`tests/unit/test_source_tree.py` proves it against `git archive`). Like Go's `dirhash` and Nix's
`fetchFromGitHub`, it pins content, not archive bytes, which GitHub does not promise to keep stable.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtllm_entrypoint.errors import Error, UsageError

PREFIX = "tree1:"
REGULAR, EXECUTABLE, SYMLINK = "100644", "100755", "120000"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the repository root
    mode: str  # REGULAR, EXECUTABLE or SYMLINK
    sha256: str  # of the file's bytes, or of a symlink's target


def entry(path: str, mode: str, content: bytes) -> Entry:
    return Entry(path, mode, hashlib.sha256(content).hexdigest())


def digest(entries: Iterable[Entry]) -> str:
    """The tree1 digest of `entries`; a path given twice or holding a newline is an error (the lines would be
    ambiguous)."""
    ordered = sorted(entries, key=lambda e: e.path.encode())
    body = hashlib.sha256()
    for before, current in zip([None, *ordered], ordered, strict=False):
        if "\n" in current.path or (before is not None and before.path == current.path):
            raise Error(f"cannot digest {current.path!r}: a newline in a path or a path given twice")
        body.update(f"{current.mode} {current.sha256} {current.path}\n".encode())
    return PREFIX + body.hexdigest()


def is_digest(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX) and _is_hex(value[len(PREFIX) :], 64)


def is_commit(value: object) -> bool:
    return isinstance(value, str) and _is_hex(value, 40)


def _is_hex(value: str, length: int) -> bool:
    return len(value) == length and set(value) <= _HEX


def normalize_paths(paths: Iterable[str]) -> tuple[str, ...]:
    """Sorted, without duplicates and without a path that another one already covers."""
    unique = sorted(set(paths))
    return tuple(p for p in unique if not any(covers(other, p) and other != p for other in unique))


def covers(prefix: str, path: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def under(path: str, paths: Iterable[str]) -> bool:
    return any(covers(prefix, path) for prefix in paths)


def safe_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts and "." not in path.split("/")


# --- a directory on disk (the verified cache) --------------------------------------------------------------------


def from_directory(root: Path) -> str:
    """The digest of a tree in the repository layout, as extracted; anything but files, symlinks and directories
    makes it unlike any archive."""
    return digest(_walk_directory(Path(root)))


def _walk_directory(root: Path) -> Iterator[Entry]:
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                yield entry(rel, SYMLINK, os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                yield entry(rel, EXECUTABLE if info.st_mode & 0o100 else REGULAR, path.read_bytes())
            elif not stat.S_ISDIR(info.st_mode):
                yield entry(rel, "special", b"")


# --- git objects ---------------------------------------------------------------------------------------------------

# Attributes that make `git archive` change a file's bytes beyond export-subst; see _conversion().
_ATTRIBUTES = ("export-ignore", "export-subst", "ident", "eol", "text", "working-tree-encoding")


@dataclass(frozen=True)
class GitSource:
    commit: str
    digest: str
    files: int


def from_git(repo: Path, ref: str, paths: Iterable[str]) -> GitSource:
    """Commit and digest of `paths` at `ref` in a git repository (bare mirror or checkout), from its objects alone:
    the working tree, the index and the local config play no part."""
    paths = normalize_paths(paths)
    git = _Git(Path(repo))
    commit = git.text("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    listing = git.run("ls-tree", "-r", "-z", "--full-tree", commit, "--", *paths).split(b"\0")
    blobs: dict[str, tuple[str, str]] = {}
    for record in filter(None, listing):
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        path = raw_path.decode("utf-8", "surrogateescape")
        if kind == "blob":  # a submodule (kind "commit") leaves only an empty directory
            blobs[path] = (mode if mode in (EXECUTABLE, SYMLINK) else REGULAR, oid)
    attributes = git.attributes(commit, [*blobs, *_ancestors(blobs)])
    entries = []
    for path, (mode, oid) in blobs.items():
        if any(attributes[a].get("export-ignore") == "set" for a in (path, *_ancestors([path]))):
            continue
        attrs = attributes[path]
        problem = _conversion(attrs) if mode != SYMLINK else ""
        if problem:
            raise Error(
                f"{path} at {ref}: .gitattributes sets {problem}, which changes its bytes in an archive "
                "in a way this walk does not reproduce",
                "record this source from a download instead: `python build.py upstream lock` where GitHub answers",
            )
        content = git.blob(oid)
        if attrs.get("export-subst") == "set" and mode != SYMLINK:
            content = _expand_format(git, commit, content)
        entries.append(entry(path, mode, content))
    if not entries:
        raise UsageError(
            f"{ref} has none of {', '.join(paths)} in {repo}",
            "check that the directory is a clone of the right repository, and the ref",
        )
    return GitSource(commit, digest(entries), len(entries))


def origin_repo(repo: Path) -> str:
    """OWNER/NAME of a GitHub clone, from its remote.origin.url (https, ssh or scp-like)."""
    try:
        url = _Git(Path(repo)).text("config", "--get", "remote.origin.url")
    except UsageError:
        url = ""
    match = re.search(r"github\.com[:/]([\w.-]+/[\w.-]+?)(?:\.git)?/?$", url)
    if not match:
        raise UsageError(
            f"cannot tell which GitHub repository {repo} is a clone of (remote.origin.url: {url or 'none'})",
            "give it as --repo OWNER/NAME",
        )
    return match.group(1)


def _ancestors(paths: Iterable[str]) -> list[str]:
    """Every directory above the paths, as `git archive` asks for its attributes: with a trailing slash."""
    found = dict.fromkeys(
        "/".join(parts[:i]) + "/" for parts in (p.split("/") for p in paths) for i in range(1, len(parts))
    )
    return list(found)


def _conversion(attrs: dict[str, str]) -> str:
    """Attributes under which `git archive` rewrites a blob on the way out (GitHub keeps the default eol=lf)."""
    if attrs.get("ident") == "set":
        return "ident"
    if attrs.get("working-tree-encoding") not in (None, "unspecified", "unset"):
        return f"working-tree-encoding={attrs['working-tree-encoding']}"
    if attrs.get("eol") == "crlf" and attrs.get("text") != "unset":
        return "eol=crlf"
    return ""


def _expand_format(git: _Git, commit: str, content: bytes) -> bytes:
    """What `git archive` does to an export-subst file: each `$Format:<fmt>$` becomes the commit's pretty format."""
    out, rest = bytearray(), content
    while (start := rest.find(b"$Format:")) >= 0 and (end := rest.find(b"$", start + 8)) >= 0:
        fmt = rest[start + 8 : end].decode("utf-8", "surrogateescape")
        out += rest[:start] + git.run("show", "-s", "--no-color", f"--format=format:{fmt}", commit)
        rest = rest[end + 1 :]
    return bytes(out + rest)


class _Git:
    """git on one repository, isolated from the user's and the system's config and attributes."""

    def __init__(self, repo: Path):
        if not repo.is_dir():
            raise UsageError(f"--from-git {repo} is not a directory", "give a clone or a mirror of the repository")
        self.repo = repo
        self.env = {
            **os.environ,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_LITERAL_PATHSPECS": "1",
            "LC_ALL": "C",
        }

    def run(self, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> bytes:
        try:
            done = subprocess.run(
                ["git", "-C", str(self.repo), "-c", "core.attributesFile=" + os.devnull, *args],
                input=stdin,
                capture_output=True,
                env=env or self.env,
                check=False,
            )
        except FileNotFoundError:
            raise UsageError("git is not installed", "install git to record sources from a clone") from None
        if done.returncode != 0:
            reason = done.stderr.decode(errors="replace").strip().splitlines() or ["no such ref"]
            raise UsageError(f"git {args[0]} in {self.repo} failed: {reason[-1]}", "check the directory and the ref")
        return done.stdout

    def text(self, *args: str) -> str:
        return self.run(*args).decode().strip()

    def blob(self, oid: str) -> bytes:
        return self.run("cat-file", "blob", oid)

    def attributes(self, commit: str, paths: list[str]) -> dict[str, dict[str, str]]:
        """The attributes the commit's own .gitattributes files give each path (read through a throwaway index, as
        `git check-attr --source` needs git >= 2.40)."""
        result: dict[str, dict[str, str]] = {path: {} for path in paths}
        with tempfile.TemporaryDirectory(prefix="trtllm-images-git-") as scratch:
            env = {**self.env, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
            self.run("read-tree", commit, env=env)
            query = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
            raw = self.run("check-attr", "--cached", "-z", "--stdin", *_ATTRIBUTES, env=env, stdin=query)
        fields = raw.split(b"\0")
        for i in range(0, len(fields) - 2, 3):
            path = fields[i].decode("utf-8", "surrogateescape")
            result.setdefault(path, {})[fields[i + 1].decode()] = fields[i + 2].decode()
        return result
