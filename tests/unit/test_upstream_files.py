"""harness/upstream_files.py: the order of the sources, and skip versus fail (CI=true) when none has the files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from harness import upstream_files
from tests.archive_server import refused_url
from trtllm_images.sources import upstream

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No source unless a test adds one: no env var, no ../shared, an empty cache; the resolution is not cached."""
    monkeypatch.delenv(upstream_files.ENV, raising=False)
    monkeypatch.setattr(upstream_files, "SHARED", tmp_path / "no-shared")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    upstream_files._resolve.cache_clear()
    upstream_files._pinned_layout.cache_clear()
    yield tmp_path
    upstream_files._resolve.cache_clear()
    upstream_files._pinned_layout.cache_clear()


def test_env_var_wins_over_shared(fresh, monkeypatch):
    (fresh / "copy/kserve/crd").mkdir(parents=True)
    (fresh / "no-shared/kserve/crd").mkdir(parents=True)
    monkeypatch.setenv(upstream_files.ENV, str(fresh / "copy"))
    assert upstream_files.find("kserve/crd") == fresh / "copy/kserve/crd"


def test_shared_is_used_without_the_env_var(fresh):
    (fresh / "no-shared/kserve/crd").mkdir(parents=True)
    assert upstream_files.find("kserve/crd") == fresh / "no-shared/kserve/crd"


def test_a_path_missing_from_the_chosen_copy_names_it(fresh, monkeypatch):
    (fresh / "copy").mkdir()
    monkeypatch.setenv(upstream_files.ENV, str(fresh / "copy"))
    monkeypatch.setattr(upstream, "load_lock", lambda: upstream.Lock(()))  # the pinned sources have nothing either
    with pytest.raises(
        upstream_files.UpstreamMissing,
        match=r"kserve/crd is missing from \S*copy and the pinned sources are unavailable \(.*\); set TRTLLM_",
    ):
        upstream_files.find("kserve/crd")


def test_without_any_source_the_cache_is_tried_and_the_message_says_how_to_get_the_files(fresh, monkeypatch):
    pin = upstream.new_pin("kserve/kserve", "v0.20.0", ["config/crd/full"])
    offline = replace(pin, url=refused_url(), layout=MappingProxyType({"config/crd/full": "kserve/crd"}))
    monkeypatch.setattr(upstream, "load_lock", lambda: upstream.Lock((offline,)))
    with pytest.raises(upstream_files.UpstreamMissing) as info:
        upstream_files.find("kserve/crd")
    message = str(info.value)
    assert "cannot download kserve/kserve@v0.20.0" in message and "offline" in message
    assert upstream_files.ENV in message and "python build.py upstream fetch" in message
    assert "\n" not in message
    assert not (fresh / "xdg/trtllm-images/layout").exists()


HELPER_TEST = textwrap.dedent("""
    from harness.upstream_files import upstream_path

    def test_needs_upstream():
        upstream_path("kserve/crd")
""")


@pytest.mark.process
@pytest.mark.parametrize("ci, outcome", [("", "1 skipped"), ("true", "1 failed")])
def test_missing_files_skip_with_one_line_or_fail_under_ci(tmp_path, ci, outcome):
    """In a separate pytest: a directory as TRTLLM_UPSTREAM_DIR that lacks the files."""
    (tmp_path / "test_needs.py").write_text(HELPER_TEST)
    (tmp_path / "empty").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "CI": ci,
        upstream_files.ENV: str(tmp_path / "empty"),
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path / "test_needs.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outcome in result.stdout, result.stdout + result.stderr
    assert "kserve/crd is missing from" in result.stdout and "python build.py upstream fetch" in result.stdout


def test_a_worktree_finds_the_copy_beside_its_main_checkout(tmp_path):
    main = tmp_path / "main"
    (main / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (main / ".git" / "worktrees" / "wt" / "commondir").write_text("../..\n")
    worktree = tmp_path / "elsewhere" / "wt"
    worktree.mkdir(parents=True)
    (worktree / ".git").write_text(f"gitdir: {main / '.git' / 'worktrees' / 'wt'}\n")
    assert upstream_files._main_checkout(worktree) == main.resolve()
    assert upstream_files._main_checkout(main) == main, "a main checkout is its own"
