"""upstream: pinned archives downloaded from a real HTTP server on 127.0.0.1, verified before they reach the cache.

Good, tampered, truncated and cut-off downloads and a refused connection; after each failure the cache holds nothing
(no archive, no temp file), so no later run can pick up an unverified archive.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from tests.archive_server import ArchiveServer, refused_url, sha256, tarball
from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import backend_assets, matrix, upstream
from trtllm_images.upstream import Lock, Pin

GOOD = tarball(
    "kserve-0.20.0",
    {
        "config/crd/full/serving.kserve.io_servingruntimes.yaml": b"kind: CustomResourceDefinition\n",
        "config/crd/full/kustomization.yaml": b"not kept\n",
        "tools/run.sh": b"#!/bin/sh\n",
        "README.md": b"not kept\n",
    },
    symlinks={"tools/inside": "run.sh", "tools/outside": "../../../etc/passwd", "tools/absolute": "/etc/passwd"},
)
LAYOUT = MappingProxyType(
    {"config/crd/full/serving.kserve.io_servingruntimes.yaml": "kserve/crd/serving.kserve.io_servingruntimes.yaml"}
)


def quiet(message: str) -> None:
    pass


@pytest.fixture
def server():
    with ArchiveServer() as running:
        running.served["/kserve.tar.gz"] = GOOD
        yield running


def pin_for(server: ArchiveServer, sha: str | None = sha256(GOOD), path: str = "/kserve.tar.gz") -> Pin:
    return Pin("kserve/kserve", "v0.20.0", server.url(path), sha, "" if sha else upstream.NOT_RECORDED, LAYOUT)


def fetch(pin: Pin, cache: Path, **kw) -> Path:
    return upstream.fetch(pin, cache, local_copy="--backend-dir DIR", log=quiet, **kw)


def cache_files(cache: Path) -> list[str]:
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())


def test_good_archive_is_published_under_its_digest_and_reused(server, tmp_path):
    archive = fetch(pin_for(server), tmp_path)
    assert archive == tmp_path / "archives" / f"{sha256(GOOD)}.tar.gz"
    assert archive.read_bytes() == GOOD
    assert fetch(pin_for(server), tmp_path) == archive
    assert server.requests == ["/kserve.tar.gz"]
    assert cache_files(tmp_path) == [f"archives/{sha256(GOOD)}.tar.gz"]


def test_tampered_archive_names_archive_expected_and_actual_digest_and_caches_nothing(server, tmp_path):
    tampered = tarball("kserve-0.20.0", {"config/crd/full/serving.kserve.io_servingruntimes.yaml": b"evil\n"})
    server.served["/kserve.tar.gz"] = tampered
    with pytest.raises(Error) as info:
        fetch(pin_for(server), tmp_path)
    message = info.value.message
    assert "kserve/kserve@v0.20.0" in message and sha256(GOOD) in message and sha256(tampered) in message
    assert "\n" not in message
    assert cache_files(tmp_path) == []


def test_truncated_archive_fails_the_digest_and_unpinned_fails_the_integrity_pass(server, tmp_path):
    server.served["/kserve.tar.gz"] = GOOD[: len(GOOD) // 2]
    with pytest.raises(Error, match="sha256 mismatch"):
        fetch(pin_for(server), tmp_path)
    with pytest.raises(Error, match="not a complete .tar.gz"):
        fetch(pin_for(server, sha=None), tmp_path, allow_unpinned=True)
    assert cache_files(tmp_path) == []


def test_interrupted_download_is_an_error_and_leaves_no_partial_file(server, tmp_path):
    server.cut["/kserve.tar.gz"] = len(GOOD) // 3
    for sha in (sha256(GOOD), None):
        with pytest.raises(Error, match=f"closed after {len(GOOD) // 3} of {len(GOOD)} bytes"):
            fetch(pin_for(server, sha=sha), tmp_path, allow_unpinned=True)
    assert cache_files(tmp_path) == []


def test_cut_off_body_without_content_length_is_caught_by_digest_or_integrity_pass(server, tmp_path):
    server.unsized.add("/kserve.tar.gz")
    server.cut["/kserve.tar.gz"] = len(GOOD) // 2
    with pytest.raises(Error, match="sha256 mismatch"):
        fetch(pin_for(server), tmp_path)
    with pytest.raises(Error, match="not a complete .tar.gz"):
        fetch(pin_for(server, sha=None), tmp_path, allow_unpinned=True)
    assert cache_files(tmp_path) == []


def test_offline_names_the_local_copy_to_supply(tmp_path):
    pin = Pin("kserve/kserve", "v0.20.0", refused_url(), sha256(GOOD))
    with pytest.raises(Error, match="offline") as info:
        fetch(pin, tmp_path)
    assert "--backend-dir DIR" in info.value.hint
    assert cache_files(tmp_path) == []


def test_http_error_is_one_line_naming_the_url(server, tmp_path):
    with pytest.raises(Error, match="HTTP 404") as info:
        fetch(pin_for(server, path="/missing.tar.gz"), tmp_path)
    assert server.url("/missing.tar.gz") in info.value.message


def test_unpinned_archive_is_refused_without_any_request_unless_allowed(server, tmp_path):
    messages = []
    with pytest.raises(Error, match="kserve/kserve@v0.20.0 is not pinned") as info:
        fetch(pin_for(server, sha=None), tmp_path)
    assert upstream.REFRESH in info.value.hint and upstream.ALLOW_UNPINNED_FLAG in info.value.hint
    assert "--backend-dir DIR" in info.value.hint
    assert server.requests == []
    archive = upstream.fetch(
        pin_for(server, sha=None), tmp_path, local_copy="x", log=messages.append, allow_unpinned=True
    )
    assert archive.read_bytes() == GOOD
    assert any("unverified" in m for m in messages)


def test_archive_changed_in_the_cache_is_downloaded_again(server, tmp_path):
    archive = fetch(pin_for(server), tmp_path)
    archive.write_bytes(b"changed on disk")
    assert fetch(pin_for(server), tmp_path).read_bytes() == GOOD
    assert len(server.requests) == 2


@pytest.mark.parametrize("name", ["/etc/cron.d/evil", "../escape.txt"])
def test_unsafe_member_path_refuses_the_whole_archive(server, tmp_path, name):
    evil = tarball("top", {"README.md": b"", name: b"x"})
    server.served["/kserve.tar.gz"] = evil
    with pytest.raises(Error, match="unsafe path"):
        fetch(pin_for(server, sha=sha256(evil)), tmp_path)
    assert cache_files(tmp_path) == []


def test_size_limit_stops_the_download(server, tmp_path, monkeypatch):
    monkeypatch.setattr(upstream, "MAX_ARCHIVE_BYTES", len(GOOD) - 1)
    monkeypatch.setattr(upstream, "CHUNK", 64)
    with pytest.raises(Error, match="larger than"):
        fetch(pin_for(server), tmp_path)
    assert cache_files(tmp_path) == []


def test_unpacked_size_limit_refuses_the_archive(server, tmp_path, monkeypatch):
    monkeypatch.setattr(upstream, "MAX_UNPACKED_BYTES", 8)
    with pytest.raises(Error, match="unpacks to more than"):
        fetch(pin_for(server), tmp_path)
    assert cache_files(tmp_path) == []


def test_extract_keeps_the_members_asked_for_and_only_links_that_stay_inside(server, tmp_path):
    archive = fetch(pin_for(server), tmp_path / "cache")
    upstream.extract(archive, "kserve", {"tools": "bin", **LAYOUT}, tmp_path / "out")
    got = sorted(
        p.relative_to(tmp_path / "out").as_posix()
        for p in (tmp_path / "out").rglob("*")
        if p.is_file() or p.is_symlink()
    )
    assert got == ["bin/inside", "bin/run.sh", "kserve/crd/serving.kserve.io_servingruntimes.yaml"]
    assert (tmp_path / "out/bin/run.sh").stat().st_mode & 0o111


def test_materialize_layout_builds_the_upstream_dir_once_per_lock(server, tmp_path):
    lock = Lock((pin_for(server),))
    root = upstream.materialize_layout(lock, tmp_path, local_copy="x", log=quiet)
    assert (
        root / "kserve/crd/serving.kserve.io_servingruntimes.yaml"
    ).read_bytes() == b"kind: CustomResourceDefinition\n"
    assert upstream.materialize_layout(lock, tmp_path, local_copy="x", log=quiet) == root
    other = Lock((replace(pin_for(server), layout=MappingProxyType({"tools": "tools"})),))
    assert upstream.materialize_layout(other, tmp_path, local_copy="x", log=quiet) != root


def test_materialize_layout_with_an_unpinned_archive_writes_nothing(server, tmp_path):
    with pytest.raises(Error, match="not pinned"):
        upstream.materialize_layout(Lock((pin_for(server, sha=None),)), tmp_path, local_copy="x", log=quiet)
    assert not (tmp_path / "layout").exists()


# --- the lock ---------------------------------------------------------------------------------------------------


def test_refresh_records_missing_digests_keeps_test_archives_and_drops_stale_ones(server, tmp_path):
    server.served["/b.tar.gz"] = b"backend bytes"
    wanted = Pin("o/backend", "v1.0.0", server.url("/b.tar.gz"), None, upstream.NOT_RECORDED)
    stale = Pin("o/backend", "v0.1.0", server.url("/b.tar.gz"), "0" * 64)
    lock = Lock((pin_for(server, sha=None), wanted, stale), tmp_path / "lock.json")
    fresh = upstream.refresh(lock, [("o/backend", "v1.0.0")], log=quiet)
    assert {p.name: p.sha256 for p in fresh.pins} == {
        "kserve/kserve@v0.20.0": sha256(GOOD),
        "o/backend@v1.0.0": sha256(b"backend bytes"),
    }
    assert all(p.uncertain == "" for p in fresh.pins)
    assert fresh.pins[0].layout == LAYOUT


def test_refresh_refuses_a_changed_digest_unless_repinned(server, tmp_path):
    lock = Lock((pin_for(server, sha="f" * 64),), tmp_path / "lock.json")
    with pytest.raises(Error, match=f"expected {'f' * 64}, got {sha256(GOOD)}") as info:
        upstream.refresh(lock, [], log=quiet)
    assert "--repin" in info.value.hint
    fresh = upstream.refresh(lock, [], repin=["kserve/kserve@v0.20.0"], log=quiet)
    assert fresh.pins[0].sha256 == sha256(GOOD)
    with pytest.raises(UsageError, match="no archive"):
        upstream.refresh(lock, [], repin=["nope@v1"], log=quiet)


def test_refresh_records_a_ref_that_does_not_exist_and_stops_when_offline(server, tmp_path):
    gone = Pin("o/r", "v9", server.url("/gone.tar.gz"), None, upstream.NOT_RECORDED, LAYOUT)
    (fresh,) = upstream.refresh(Lock((gone,)), [], log=quiet).pins
    assert fresh.sha256 is None and "HTTP 404" in fresh.uncertain
    offline = Pin("o/r", "v9", refused_url(), None, upstream.NOT_RECORDED, LAYOUT)
    with pytest.raises(Error, match="offline"):
        upstream.refresh(Lock((offline,)), [], log=quiet)


def test_lock_round_trips(tmp_path):
    pinned = Pin("o/r", "v1", "https://x/a.tar.gz", "a" * 64, "", LAYOUT)
    lock = Lock((pinned, Pin("o/r", "v2", "https://x/b.tar.gz", None, upstream.NOT_RECORDED)), tmp_path / "lock.json")
    upstream.write_lock(lock)
    assert upstream.load_lock(lock.path) == lock


@pytest.mark.parametrize(
    "change, words",
    [
        ({"sha256": None}, "needs an `uncertain` reason"),
        ({"sha256": "ABC"}, "not 64 lowercase hex"),
        ({"layout": {"../x": "y"}}, "relative"),
        ({"layout": {"x": "/etc"}}, "relative"),
    ],
)
def test_lock_rejects_what_it_cannot_trust(tmp_path, change, words):
    record = {"repo": "o/r", "ref": "v1", "url": "https://x/a.tar.gz", "sha256": "a" * 64, **change}
    path = tmp_path / "lock.json"
    path.write_text(json.dumps({"archives": [record]}))
    with pytest.raises(UsageError, match=words):
        upstream.load_lock(path)


def test_the_repository_lock_pins_every_archive_the_matrix_needs():
    lock = upstream.load_lock()
    names = {pin.name for pin in lock.pins}
    missing = [f"{repo}@{ref}" for repo, ref in backend_assets.lock_keys(matrix.load()) if f"{repo}@{ref}" not in names]
    assert not missing, f"run `{upstream.REFRESH}`: the lock lacks {missing}"
    assert all(pin.sha256 or pin.uncertain for pin in lock.pins)
    layout = {target.split("/")[0] for pin in lock.pins for target in pin.layout.values()}
    # Templates, KServe's CRDs, and the scale-out CRDs (LeaderWorkerSet, PodMonitor, KEDA ScaledObject).
    assert layout == {"tensorrtllm_backend", "tensorrt_llm", "kserve", "lws", "prometheus-operator", "keda"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"XDG_CACHE_HOME": "/var/tmp/xdg"}, Path("/var/tmp/xdg/trtllm-images")),
        ({"XDG_CACHE_HOME": "relative/ignored"}, Path.home() / ".cache" / "trtllm-images"),
        ({}, Path.home() / ".cache" / "trtllm-images"),
    ],
)
def test_cache_root_follows_xdg(environ, expected):
    assert upstream.cache_root(environ) == expected
