"""upstream: sources downloaded from a real HTTP server on 127.0.0.1, extracted safely and verified by content before
they reach the cache; trust on first use for sources the lock does not pin; the lock itself.

After each failure the cache holds nothing (no source tree, no temp file), so no later run can pick up an unverified
tree; and no hostile archive writes anything outside its extraction directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from tests.archive_server import ArchiveServer, link, refused_url, regular, tarball
from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import matrix
from trtllm_images.sources import archive as safe_archive
from trtllm_images.sources import backend_assets, upstream
from trtllm_images.sources import cache as source_cache
from trtllm_images.sources import tree as source_tree
from trtllm_images.sources.upstream import Lock, Pin

COMMIT = "1fb781055dd1567164358233e1125142ca6ef1fe"
CRD = "config/crd/full/serving.kserve.io_servingruntimes.yaml"
FILES = {
    CRD: b"kind: CustomResourceDefinition\n",
    "config/crd/full/kustomization.yaml": b"kept: under a pinned path\n",
    "tools/run.sh": b"#!/bin/sh\n",
    "README.md": b"not kept\n",
}
LINKS = {"tools/inside": "run.sh", "tools/via": "inside"}
GOOD = tarball("kserve-0.20.0", FILES, LINKS, commit=COMMIT)
PATHS = ("config/crd/full", "tools")
LAYOUT = MappingProxyType({CRD: "kserve/crd/serving.kserve.io_servingruntimes.yaml"})


def digest_of(files: dict[str, bytes], links: dict[str, str], paths=PATHS) -> str:
    entries = [
        source_tree.entry(p, source_tree.EXECUTABLE if p.endswith(".sh") else source_tree.REGULAR, data)
        for p, data in files.items()
        if source_tree.under(p, paths)
    ]
    entries += [source_tree.entry(p, source_tree.SYMLINK, t.encode()) for p, t in links.items()]
    return source_tree.digest(entries)


DIGEST = digest_of(FILES, LINKS)


def quiet(message: str) -> None:
    pass


@pytest.fixture
def server():
    with ArchiveServer() as running:
        running.served["/kserve.tar.gz"] = GOOD
        yield running


def pin_for(server: ArchiveServer, digest: str | None = DIGEST, path: str = "/kserve.tar.gz", commit=COMMIT) -> Pin:
    uncertain = "" if digest else upstream.NOT_RECORDED
    return Pin(
        "kserve/kserve", "v0.20.0", server.url(path), PATHS, commit if digest else None, digest, uncertain, LAYOUT
    )


def fetch(pin: Pin, cache: Path, **kw) -> Path:
    return source_cache.source(pin, cache, local_copy="--backend-dir DIR", log=kw.pop("log", quiet), **kw)


def cache_files(cache: Path) -> list[str]:
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if not p.is_dir())


def tree_files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_text())
        for p in sorted(root.rglob("*"))
        if not p.is_dir() or p.is_symlink()
    }


# --- verified by content ---------------------------------------------------------------------------------------


def test_good_source_is_published_under_its_digest_and_reused_without_a_request(server, tmp_path):
    tree = fetch(pin_for(server), tmp_path)
    assert tree == tmp_path / "sources" / DIGEST.removeprefix("tree1:")
    assert tree_files(tree) == {
        "config/crd/full/kustomization.yaml": "kept: under a pinned path\n",
        CRD: "kind: CustomResourceDefinition\n",
        "tools/inside": "-> run.sh",
        "tools/run.sh": "#!/bin/sh\n",
        "tools/via": "-> inside",
    }
    assert (tree / "tools/run.sh").stat().st_mode & 0o777 == 0o755
    assert (tree / CRD).stat().st_mode & 0o777 == 0o644
    assert fetch(pin_for(server), tmp_path) == tree
    assert server.requests == ["/kserve.tar.gz"]


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz", ""])
def test_any_compression_gives_the_same_digest(server, tmp_path, compression):
    server.served["/kserve.tar.gz"] = tarball("other-top", FILES, LINKS, compression=compression, commit=COMMIT)
    assert fetch(pin_for(server), tmp_path).name == DIGEST.removeprefix("tree1:")


def test_tampered_content_names_source_expected_and_actual_digest_and_keeps_nothing(server, tmp_path):
    tampered = {**FILES, CRD: b"evil\n"}
    server.served["/kserve.tar.gz"] = tarball("kserve-0.20.0", tampered, LINKS, commit=COMMIT)
    with pytest.raises(Error) as info:
        fetch(pin_for(server), tmp_path)
    message = info.value.message
    assert "kserve/kserve@v0.20.0" in message and DIGEST in message and digest_of(tampered, LINKS) in message
    assert "\n" not in message and "--repin" in info.value.hint
    assert cache_files(tmp_path) == []


@pytest.mark.parametrize("change", ["exec bit", "link target", "extra file", "missing file"])
def test_every_part_of_the_content_counts(server, tmp_path, change):
    files, links = dict(FILES), dict(LINKS)
    if change == "exec bit":
        files["tools/run"] = files.pop("tools/run.sh")
    elif change == "link target":
        links["tools/via"] = "run.sh"
    elif change == "extra file":
        files["tools/new.py"] = b""
    else:
        del files["config/crd/full/kustomization.yaml"]
    server.served["/kserve.tar.gz"] = tarball("kserve-0.20.0", files, links, commit=COMMIT)
    with pytest.raises(Error, match="content of config/crd/full, tools differs"):
        fetch(pin_for(server), tmp_path)


def test_a_moved_tag_with_the_same_content_is_still_refused(server, tmp_path):
    server.served["/kserve.tar.gz"] = tarball("kserve-0.20.0", FILES, LINKS, commit="a" * 40)
    with pytest.raises(Error, match=f"the commit differs from upstream.lock.json: expected {COMMIT}"):
        fetch(pin_for(server), tmp_path)


def test_a_cached_tree_changed_on_disk_is_fetched_again(server, tmp_path):
    tree = fetch(pin_for(server), tmp_path)
    (tree / CRD).write_text("changed on disk\n")
    messages: list[str] = []
    assert fetch(pin_for(server), tmp_path, log=messages.append) == tree
    assert (tree / CRD).read_text() == "kind: CustomResourceDefinition\n"
    assert any("no longer matches" in m for m in messages) and len(server.requests) == 2


@pytest.mark.parametrize("damage", ["truncated", "cut", "cut without length", "not an archive"])
def test_a_damaged_download_is_one_error_and_leaves_nothing(server, tmp_path, damage):
    if damage == "truncated":
        server.served["/kserve.tar.gz"] = GOOD[: len(GOOD) - 20]
    elif damage == "not an archive":
        server.served["/kserve.tar.gz"] = b"<html>rate limited</html>" * 40
    else:
        server.cut["/kserve.tar.gz"] = len(GOOD) // 2
        if damage == "cut without length":
            server.unsized.add("/kserve.tar.gz")
    for pin in (pin_for(server), pin_for(server, digest=None)):
        with pytest.raises(Error, match="not a complete tar archive|closed after") as info:
            fetch(pin, tmp_path)
        assert "\n" not in info.value.message
    assert cache_files(tmp_path) == []


def test_offline_is_one_line_naming_the_local_copy_to_supply(tmp_path):
    pin = Pin("kserve/kserve", "v0.20.0", refused_url(), PATHS, COMMIT, DIGEST)
    with pytest.raises(Error, match="offline") as info:
        fetch(pin, tmp_path)
    assert "\n" not in str(info.value) and "--backend-dir DIR" in info.value.hint
    assert cache_files(tmp_path) == []


def test_http_error_is_one_line_naming_the_url(server, tmp_path):
    with pytest.raises(Error, match="HTTP 404") as info:
        fetch(pin_for(server, path="/missing.tar.gz"), tmp_path)
    assert server.url("/missing.tar.gz") in info.value.message


def test_size_limits_stop_the_download_and_the_extraction(server, tmp_path, monkeypatch):
    monkeypatch.setattr(safe_archive, "MAX_ARCHIVE_BYTES", len(GOOD) - 1)
    monkeypatch.setattr(safe_archive, "CHUNK", 64)
    with pytest.raises(Error, match="larger than"):
        fetch(pin_for(server), tmp_path)
    monkeypatch.setattr(safe_archive, "MAX_ARCHIVE_BYTES", 1 << 20)
    monkeypatch.setattr(safe_archive, "MAX_UNPACKED_BYTES", 8)
    with pytest.raises(Error, match="unpacks to more than"):
        fetch(pin_for(server), tmp_path)
    assert cache_files(tmp_path) == []


# --- trust on first use ----------------------------------------------------------------------------------------


def test_an_unpinned_source_is_trusted_on_first_use_with_one_line_and_must_match_later(server, tmp_path):
    messages: list[str] = []
    tree = fetch(pin_for(server, digest=None), tmp_path, log=messages.append)
    (line,) = [m for m in messages if "trust on first use" in m]
    assert "kserve/kserve@v0.20.0" in line and COMMIT in line and DIGEST in line and "\n" not in line
    trusted = json.loads((tmp_path / source_cache.TRUST_FILE).read_text())
    assert trusted["kserve/kserve@v0.20.0"]["digest"] == DIGEST
    assert fetch(pin_for(server, digest=None), tmp_path) == tree
    server.served["/kserve.tar.gz"] = tarball("kserve-0.20.0", {**FILES, CRD: b"evil\n"}, LINKS, commit=COMMIT)
    shutil.rmtree(tree)  # the next fetch downloads again
    with pytest.raises(Error, match="content of config/crd/full, tools differs from .*trusted.json") as info:
        fetch(pin_for(server, digest=None), tmp_path)
    assert str(tmp_path / source_cache.TRUST_FILE) in info.value.message
    assert json.loads((tmp_path / source_cache.TRUST_FILE).read_text()) == trusted


@pytest.mark.parametrize("content", ["not json", "[]", '{"kserve/kserve@v0.20.0": {"commit": null}}'])
def test_a_damaged_trust_file_is_an_error_never_an_empty_trust_store(server, tmp_path, content):
    (tmp_path / source_cache.TRUST_FILE).write_text(content)
    with pytest.raises(Error, match="trusted.json is malformed") as info:
        fetch(pin_for(server, digest=None), tmp_path)
    assert "delete it" in info.value.hint and server.requests == []
    assert (tmp_path / source_cache.TRUST_FILE).read_text() == content


def test_require_pinned_refuses_an_unpinned_source_without_any_request(server, tmp_path):
    with pytest.raises(Error, match="kserve/kserve@v0.20.0 is not pinned in upstream.lock.json") as info:
        fetch(pin_for(server, digest=None), tmp_path, require_pinned=True)
    assert "--from-git" in info.value.hint and server.requests == []
    assert fetch(pin_for(server), tmp_path, require_pinned=True).is_dir()


# --- safe extraction (links already written are followed by the OS) ------------------------------------------


def extract_members(tmp_path: Path, members: list[tarfile.TarInfo], files: dict[str, bytes] | None = None) -> Path:
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(tarball("top", files or {"src/ok.txt": b"ok\n"}, members=members))
    dest = tmp_path / "deep" / "er" / "root"
    dest.parent.mkdir(parents=True)
    safe_archive.extract(archive, "evil", ["src"], dest)
    return dest


def written_outside(tmp_path: Path) -> list[str]:
    expected = {"evil.tar.gz", "deep", "deep/er", "deep/er/root"}
    return [
        p.relative_to(tmp_path).as_posix()
        for p in tmp_path.rglob("*")
        if p.relative_to(tmp_path).as_posix() not in expected and "deep/er/root/" not in p.as_posix()
    ]


HOSTILE = {
    "the issue's chain": [
        link("top/src/x/y", ".."),
        link("top/src/q", "x/y/.."),
        link("top/src/q/z", ".."),
        regular("top/src/q/z/escaped"),
    ],
    # Lexically inside (src/q -> src/x/../.. = the root) when written; outside once x/y is a link.
    "the chain, links written in another order": [link("top/src/q", "x/y/../.."), link("top/src/x/y", "..")],
    "a link to a link that leaves": [link("top/src/a", "b"), link("top/src/b", "../../outside")],
    "a link to a link, reversed": [link("top/src/b", "../../outside"), link("top/src/a", "b")],
    "a file through a directory link": [link("top/src/d", "../.."), regular("top/src/d/escaped")],
    "a file through an inside link to a leaving link": [
        link("top/src/up", "../.."),
        link("top/src/d", "up"),
        regular("top/src/d/escaped"),
    ],
    "a link replaced by a file": [link("top/src/f", "../../../escaped"), regular("top/src/f")],
    "a directory replaced by a link": [tarfile.TarInfo("top/src/dir"), link("top/src/dir", "../..")],
    "a link over a directory made for a file": [regular("top/src/made/file"), link("top/src/made", "../..")],
    "an absolute link": [link("top/src/abs", "/etc")],
    "a hard link": [link("top/src/hard", "top/src/ok.txt", tarfile.LNKTYPE)],
    "a member outside the top directory": [regular("elsewhere/src/x")],
    "a dotdot path": [regular("top/src/../../escaped")],
}


@pytest.mark.parametrize("members", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_archives_are_refused_and_nothing_lands_outside(tmp_path, members):
    with pytest.raises(Error, match="in the archive") as info:
        extract_members(tmp_path, members)
    assert "\n" not in info.value.message and "nothing was kept" in info.value.hint
    assert written_outside(tmp_path) == []


def test_random_link_chains_never_write_outside(tmp_path):
    """Held-out variants of the class: 300 archives of links and files drawn from names and targets that combine
    into chains (seeded, so a failure reproduces). Each is refused, or extracted with every link resolving inside."""
    rng = random.Random(23)
    names = ["src/a", "src/b", "src/x/y", "src/q", "src/q/z", "src/a/c", "src/b/d/e"]
    targets = ["..", "../..", "a", "b", "x/y/..", "q/z", "../a", "y/../..", "c/../../..", "."]
    for case in range(300):
        root = tmp_path / str(case)
        (root / "sub").mkdir(parents=True)
        members = [
            link(f"top/{rng.choice(names)}", rng.choice(targets))
            if rng.random() < 0.7
            else regular(f"top/{rng.choice(names)}/f")
            for _ in range(rng.randint(1, 6))
        ]
        (root / "a.tar").write_bytes(tarball("top", {"src/ok.txt": b"ok\n"}, members=members, compression=""))
        try:
            safe_archive.extract(root / "a.tar", "random", ["src"], root / "sub" / "dest")
        except Error:
            pass
        else:
            for path in (root / "sub" / "dest").rglob("*"):
                assert os.path.realpath(path).startswith(str(root / "sub" / "dest")), (case, members)
        assert sorted(p.name for p in root.iterdir()) == ["a.tar", "sub"], case
        assert [p.name for p in (root / "sub").iterdir()] == ["dest"], case


def test_links_that_stay_inside_are_kept_chains_included(tmp_path):
    dest = extract_members(
        tmp_path,
        [
            link("top/src/x/y", ".."),
            link("top/src/q", "x/y/ok.txt"),
            link("top/src/chain", "q"),
            link("top/src/dangling", "missing/inside"),
        ],
    )
    assert (dest / "src/chain").read_text() == "ok\n"
    assert os.readlink(dest / "src/dangling") == "missing/inside"
    assert written_outside(tmp_path) == []


def test_copy_members_leaves_out_links_that_leave_their_member(server, tmp_path):
    files = {"tools/a.py": b"a", "docs/secret.md": b"s"}
    links = {"tools/up": "../docs/secret.md", "tools/same": "a.py"}
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(tarball("top", files, links))
    safe_archive.extract(archive, "x", ["tools", "docs"], tmp_path / "tree")
    messages: list[str] = []
    safe_archive.copy_members(tmp_path / "tree", {"tools": "bin"}, tmp_path / "out", "x", messages.append)
    assert tree_files(tmp_path / "out") == {"bin/a.py": "a", "bin/same": "-> a.py"}
    assert any("bin" not in m and "tools/up" in m for m in messages)


# --- the tests' upstream files ---------------------------------------------------------------------------------


def test_materialize_layout_builds_the_upstream_dir_once_per_content(server, tmp_path):
    lock = Lock((pin_for(server),))
    root = source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=quiet)
    assert tree_files(root) == {"kserve/crd/serving.kserve.io_servingruntimes.yaml": FILES[CRD].decode()}
    assert source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=quiet) == root
    other = Lock((replace(pin_for(server), layout=MappingProxyType({"tools": "tools"})),))
    assert source_cache.materialize_layout(other, tmp_path, local_copy="x", log=quiet) != root


def test_materialize_layout_with_needs_fetches_only_the_sources_that_lay_them_out(server, tmp_path):
    offline = Pin(
        "kedacore/keda",
        "v2.20.2",
        refused_url(),
        ("config/crd/bases",),
        None,
        None,
        upstream.NOT_RECORDED,
        MappingProxyType({"config/crd/bases": "keda"}),
    )
    lock = Lock((offline, pin_for(server)))
    root = source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=quiet, needs=("kserve/crd",))
    assert list(tree_files(root)) == ["kserve/crd/serving.kserve.io_servingruntimes.yaml"]
    with pytest.raises(Error, match="cannot download kedacore/keda@v2.20.2"):
        source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=quiet)
    with pytest.raises(Error, match="no source with a `layout` holding lws/crd"):
        source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=quiet, needs=("lws/crd",))
    assert [source_cache.covers(pin_for(server), [need]) for need in ("kserve", "kserve/crd", "kserve/c", "lws")] == [
        True,
        True,
        False,
        False,
    ]


def test_upstream_fetch_out_copies_the_verified_files_to_carry_and_never_into_a_full_directory(server, tmp_path):
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    lock = upstream.write_lock(Lock((pin_for(server),), path=tmp_path / "lock.json"))
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = tmp_path / "carry"
    done = CliRunner(env=env).invoke(cli, ["upstream", "fetch", "--lock", str(lock), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert done.stdout.strip() == str(out) and "TRTLLM_UPSTREAM_DIR" in done.stderr
    assert tree_files(out) == {"kserve/crd/serving.kserve.io_servingruntimes.yaml": FILES[CRD].decode()}
    again = CliRunner(env=env).invoke(cli, ["upstream", "fetch", "--lock", str(lock), "--out", str(out)])
    assert again.exit_code == 2 and "not empty" in again.stderr


def test_materialize_layout_with_a_tampered_source_writes_nothing(server, tmp_path):
    server.served["/kserve.tar.gz"] = tarball("kserve-0.20.0", {**FILES, CRD: b"evil\n"}, LINKS, commit=COMMIT)
    with pytest.raises(Error, match="differs"):
        source_cache.materialize_layout(Lock((pin_for(server),)), tmp_path, local_copy="x", log=quiet)
    assert not (tmp_path / "layout").exists() and cache_files(tmp_path) == []


# --- the lock --------------------------------------------------------------------------------------------------


def test_merge_adds_what_the_matrix_needs_keeps_test_sources_drops_stale_ones_and_resets_changed_paths(server):
    stale = Pin("o/backend", "v0.1.0", "u", ("tools",), "b" * 40, DIGEST)
    moved = Pin("o/backend", "v1.0.0", "u", ("tools",), "b" * 40, DIGEST)
    tests_only = replace(pin_for(server), paths=(CRD,))  # its paths are its layout's
    lock = upstream.merge(Lock((tests_only, stale, moved)), {("o/backend", "v1.0.0"): ["tools", "examples"]})
    assert [p.name for p in lock.pins] == ["kserve/kserve@v0.20.0", "o/backend@v1.0.0"]
    assert lock.pins[0] == tests_only
    assert lock.pins[1].paths == ("examples", "tools") and lock.pins[1].digest is None and lock.pins[1].uncertain


def test_refresh_records_commit_and_digest_and_refuses_a_change_unless_repinned(server, tmp_path):
    fresh = upstream.refresh(Lock((pin_for(server, digest=None),), tmp_path / "lock.json"), log=quiet)
    assert (fresh.pins[0].commit, fresh.pins[0].digest, fresh.pins[0].uncertain) == (COMMIT, DIGEST, "")
    wrong = Lock((pin_for(server, digest="tree1:" + "f" * 64),), tmp_path / "lock.json")
    with pytest.raises(Error, match=f"expected {COMMIT} tree1:f+, got {COMMIT} {DIGEST}") as info:
        upstream.refresh(wrong, log=quiet)
    assert "--repin" in info.value.hint
    assert upstream.refresh(wrong, repin=["kserve/kserve@v0.20.0"], log=quiet).pins[0].digest == DIGEST
    with pytest.raises(UsageError, match="no source"):
        upstream.refresh(wrong, repin=["nope@v1"], log=quiet)


def test_refresh_records_a_ref_that_does_not_exist_and_stops_when_offline(server):
    gone = Pin("o/r", "v9", server.url("/gone.tar.gz"), PATHS, uncertain=upstream.NOT_RECORDED)
    (fresh,) = upstream.refresh(Lock((gone,)), log=quiet).pins
    assert fresh.digest is None and "HTTP 404" in fresh.uncertain
    offline = replace(gone, url=refused_url())
    with pytest.raises(Error, match="offline"):
        upstream.refresh(Lock((offline,)), log=quiet)


def test_lock_round_trips(tmp_path):
    pinned = Pin("o/r", "v1", "https://x/a.tar.gz", PATHS, COMMIT, DIGEST, "", LAYOUT)
    lock = Lock(
        (pinned, Pin("o/r", "v2", "https://x/b.tar.gz", PATHS, uncertain=upstream.NOT_RECORDED)), tmp_path / "l"
    )
    upstream.write_lock(lock)
    assert upstream.load_lock(lock.path) == lock


@pytest.mark.parametrize(
    "change, words",
    [
        ({"digest": None}, "needs an `uncertain` reason"),
        ({"digest": "a" * 64}, "is not tree1:"),
        ({"commit": "abc"}, "not 40 lowercase hex"),
        ({"paths": []}, "relative"),
        ({"paths": ["../x"]}, "relative"),
        ({"layout": {"x": "/etc"}}, "relative"),
        ({"layout": {"docs/x": "y"}}, "under one of its `paths`"),
    ],
)
def test_lock_rejects_what_it_cannot_trust(tmp_path, change, words):
    record = {"repo": "o/r", "ref": "v1", "url": "u", "paths": ["tools"], "commit": COMMIT, "digest": DIGEST}
    path = tmp_path / "lock.json"
    path.write_text(json.dumps({"sources": [{**record, **change}]}))
    with pytest.raises(UsageError, match=words):
        upstream.load_lock(path)


def test_the_repository_lock_pins_every_mirrorable_source_the_matrix_needs():
    lock = upstream.load_lock()
    assert upstream.merge(lock, backend_assets.lock_paths(matrix.load())) == lock, f"run `{upstream.REFRESH}`"
    for pin in lock.pins:
        if pin.repo != "NVIDIA/TensorRT-LLM":  # too big to mirror here: trusted on first use until recorded
            assert pin.digest and pin.commit, f"{pin.name} is not pinned"
    layout = {target.split("/")[0] for pin in lock.pins for target in pin.layout.values()}
    # Templates, KServe's CRDs, the scale-out CRDs (LeaderWorkerSet, PodMonitor, KEDA ScaledObject), and Triton's
    # in-process Python API and OpenAI frontend (harness/realopenai.py builds them).
    assert layout == {"tensorrtllm_backend", "tensorrt_llm", "kserve", "lws", "prometheus-operator", "keda", "triton"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"XDG_CACHE_HOME": "/var/tmp/xdg"}, Path("/var/tmp/xdg/trtllm-images")),
        ({"XDG_CACHE_HOME": "relative/ignored"}, Path.home() / ".cache" / "trtllm-images"),
        ({}, Path.home() / ".cache" / "trtllm-images"),
    ],
)
def test_cache_root_follows_xdg(environ, expected):
    assert source_cache.cache_root(environ) == expected


@pytest.mark.parametrize("tamper", ["change", "add", "remove", "link"])
def test_a_poisoned_layout_is_built_again_from_its_verified_sources(server, tmp_path, tamper):
    lock = Lock((pin_for(server),))
    root = source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=quiet)
    crd = root / "kserve/crd/serving.kserve.io_servingruntimes.yaml"
    if tamper == "change":
        crd.write_text("evil\n")
    elif tamper == "add":
        (root / "kserve/crd/planted.py").write_text("import os\n")
    elif tamper == "remove":
        crd.unlink()
    else:
        crd.unlink()
        crd.symlink_to("/etc/passwd")
    said = []
    assert source_cache.materialize_layout(lock, tmp_path, local_copy="x", log=said.append) == root
    assert tree_files(root) == {"kserve/crd/serving.kserve.io_servingruntimes.yaml": FILES[CRD].decode()}
    assert any("differs from what its verified sources give" in line for line in said)
    assert [p.name for p in (tmp_path / "layout").iterdir()] == [root.name]  # no scratch copies left
