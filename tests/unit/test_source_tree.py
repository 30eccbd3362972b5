"""source_tree: the content digest of a git tree walk equals that of `git archive` of the same commit, extracted the
way downloads are; what .gitattributes does to an archive (export-ignore, export-subst) included."""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images.sources import archive as safe_archive
from trtllm_images.sources import tree as source_tree
from trtllm_images.sources import upstream

pytestmark = [pytest.mark.process, pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")]

PATHS = ("models", "tools")


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "A",
        "GIT_AUTHOR_EMAIL": "a@example.com",
        "GIT_COMMITTER_NAME": "A",
        "GIT_COMMITTER_EMAIL": "a@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, stdout=subprocess.PIPE)
    return done.stdout.decode() if done.stdout else ""


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository with everything an archive treats specially: executables, symlinks (to files, to directories, to
    links), export-ignore on a file and on a directory, export-subst, a submodule, and files outside the paths."""
    root = tmp_path / "repo"
    files = {
        "models/ensemble/config.pbtxt": "name: ensemble\n",
        "models/pre/1/model.py": "print('pre')\n",
        "models/ignored.txt": "export-ignore\n",
        "models/private/notes.md": "a directory marked export-ignore\n",
        "models/VERSION": "commit $Format:%H$ of $Format:%cs$, tree $Format:%T$; $Format:no end\n",
        "tools/fill.sh": "#!/bin/sh\n",
        "docs/README.md": "outside the paths\n",
        ".gitattributes": "models/ignored.txt export-ignore\nmodels/private export-ignore\nVERSION export-subst\n",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "tools/fill.sh").chmod(0o755)
    os.symlink("fill.sh", root / "tools/run")
    os.symlink("run", root / "tools/run-again")
    os.symlink("../models/ensemble", root / "tools/ensemble")
    git(root.parent, "init", "-q", "-b", "main", str(root))
    git(root, "add", "-A")
    git(root, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},models/submodule")
    git(root, "commit", "-q", "-m", "first")
    git(root, "tag", "v1.0.0")
    return root


def archive_digest(repo: Path, tmp_path: Path, compression: str) -> tuple[str | None, str]:
    tar = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", "--prefix=repo-1.0.0/", "v1.0.0"],
        check=True,
        capture_output=True,
    ).stdout
    data = {"gz": gzip.compress, "xz": lzma.compress, "": lambda b: b}[compression](tar)
    (tmp_path / "archive").write_bytes(data)
    return safe_archive.extract(tmp_path / "archive", "repo@v1.0.0", PATHS, tmp_path / "tree")


@pytest.mark.parametrize("compression", ["gz", "xz", ""])
def test_git_archive_and_the_tree_walk_give_the_same_commit_and_digest(repo, tmp_path, compression):
    walked = source_tree.from_git(repo, "v1.0.0", PATHS)
    commit, digest = archive_digest(repo, tmp_path, compression)
    assert (commit, digest) == (walked.commit, walked.digest)
    assert walked.commit == git(repo, "rev-parse", "v1.0.0^{commit}").strip()
    assert source_tree.from_directory(tmp_path / "tree") == digest
    # What the archive did, seen in the extracted tree: the walk reproduced each of these to match it.
    tree = tmp_path / "tree"
    assert not (tree / "models/ignored.txt").exists() and not (tree / "models/private").exists()
    assert (tree / "models/VERSION").read_text().startswith(f"commit {walked.commit} of 20")
    assert (tree / "models/VERSION").read_text().endswith("; $Format:no end\n")
    assert os.readlink(tree / "tools/run-again") == "run" and (tree / "tools/fill.sh").stat().st_mode & 0o100
    assert not (tree / "docs").exists() and walked.files == 7


def test_the_digest_follows_content_mode_and_link_target_not_metadata(repo):
    before = source_tree.from_git(repo, "v1.0.0", PATHS).digest
    (repo / "tools/fill.sh").chmod(0o644)
    git(repo, "commit", "-q", "-am", "not executable")
    assert source_tree.from_git(repo, "HEAD", PATHS).digest != before
    git(repo, "commit", "-q", "--allow-empty", "-m", "same content, new commit")
    assert (
        source_tree.from_git(repo, "HEAD", ["tools/run"]).digest
        == source_tree.from_git(repo, "v1.0.0", ["tools/run"]).digest
    )


def test_a_conversion_the_walk_cannot_reproduce_is_refused_by_name(repo):
    (repo / ".gitattributes").write_text("*.pbtxt eol=crlf\n")
    git(repo, "commit", "-q", "-am", "crlf")
    with pytest.raises(Error, match=r"models/ensemble/config.pbtxt .* sets eol=crlf") as info:
        source_tree.from_git(repo, "HEAD", PATHS)
    assert "download" in info.value.hint


@pytest.mark.parametrize(
    "ref, paths, words",
    [("v9.9.9", PATHS, "failed"), ("v1.0.0", ["nothing/here"], "has none of nothing/here")],
)
def test_a_missing_ref_or_path_is_a_usage_error(repo, ref, paths, words):
    with pytest.raises(UsageError, match=words):
        source_tree.from_git(repo, ref, paths)


def test_origin_repo_reads_github_remotes(repo):
    with pytest.raises(UsageError, match="--repo OWNER/NAME"):
        source_tree.origin_repo(repo)
    git(repo, "remote", "add", "origin", "git@github.com:kserve/kserve.git")
    assert source_tree.origin_repo(repo) == "kserve/kserve"


def test_paths_are_normalized_and_lines_are_unambiguous():
    assert source_tree.normalize_paths(["tools", "a/b", "a", "tools/x"]) == ("a", "tools")
    with pytest.raises(Error, match="newline"):
        source_tree.digest([source_tree.entry("a\n100644 x b", source_tree.REGULAR, b"")])
    with pytest.raises(Error, match="twice"):
        source_tree.digest([source_tree.entry("a", source_tree.REGULAR, b"")] * 2)


def test_upstream_lock_from_git_records_the_walk_and_leaves_a_ref_the_clone_lacks(repo, tmp_path, monkeypatch):
    """`build.py upstream lock --from-git DIR --repo O/N`: the walk's values land in the lock; a ref the clone lacks
    stays as it was, and a record nothing needs any more is dropped."""
    from click.testing import CliRunner

    from trtllm_images.cli import cli
    from trtllm_images.sources import backend_assets

    monkeypatch.setattr(backend_assets, "lock_paths", lambda matrix: {("o/r", "v1.0.0"): list(PATHS)})
    lock_path = tmp_path / "lock.json"
    other = upstream.new_pin("o/other", "v1.0.0", ["tools"])
    missing = upstream.new_pin("o/r", "v2.0.0", ["tools"])
    layout = {"tools/fill.sh": "x/fill.sh"}
    missing = upstream.Pin(missing.repo, missing.ref, missing.url, missing.paths, uncertain="u", layout=layout)
    upstream.write_lock(upstream.Lock((upstream.new_pin("o/r", "v1.0.0", PATHS), missing, other), lock_path))
    args = ["upstream", "lock", "--lock", str(lock_path), "--from-git", str(repo), "--repo", "o/r"]
    result = CliRunner().invoke(cli, args, prog_name="build.py")
    assert result.exit_code == 0, result.output
    pins = {pin.name: pin for pin in upstream.load_lock(lock_path).pins}
    walked = source_tree.from_git(repo, "v1.0.0", PATHS)
    assert (pins["o/r@v1.0.0"].commit, pins["o/r@v1.0.0"].digest) == (walked.commit, walked.digest)
    assert pins["o/r@v2.0.0"].digest is None and "left as it was" in result.stderr
    assert "o/other@v1.0.0" not in pins  # the matrix no longer needs it
    assert "2 sources, 1 without a digest (o/r@v2.0.0)" in result.stdout
