"""backend_assets: where the /app layout comes from; pinned archives from a local HTTP server; local checkouts."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from tests import factories
from tests.archive_server import ArchiveServer, refused_url, tarball
from trtllm_entrypoint.errors import Error, UsageError
from trtllm_images import matrix
from trtllm_images.matrix import Backend
from trtllm_images.sources import archive as safe_archive
from trtllm_images.sources import upstream
from trtllm_images.sources.backend_assets import Archive, archives, fetch, local_members, lock_paths
from trtllm_images.sources.upstream import Lock, Pin

LAYOUT_A = factories.matrix_entry(
    tag="24.08",
    triton="2.49.0",
    tensorrt_llm="0.12.0",
    tensorrt="10.3.0",
    cuda="12.5.1.007",
    python="3.10.12",
    pytorch=None,
    ubuntu="22.04",
    backend=Backend("triton-inference-server/tensorrtllm_backend", "v0.12.0", "", False),
    openai_frontend=False,
    uncertain=MappingProxyType({"pytorch": "test"}),
    sources=(),
)
LAYOUT_B = dataclasses.replace(
    LAYOUT_A,
    tag="25.06",
    tensorrt_llm="0.20.0",
    backend=Backend("NVIDIA/TensorRT-LLM", "v0.20.0", "triton_backend", False),
)
CONFIG = b'name: "ensemble"\n'
BACKEND_TARBALL = tarball(
    "tensorrtllm_backend-0.12.0",
    {
        "all_models/inflight_batcher_llm/ensemble/config.pbtxt": CONFIG,
        "all_models/gpt/model.py": b"not kept",
        "tools/fill_template.py": b"print('fill')\n",
        "tools/run.sh": b"#!/bin/sh\n",
        "docs/README.md": b"not kept",
    },
    symlinks={
        "tools/inside": "fill_template.py",
        "tools/readme": "../docs/README.md",  # inside the repository, outside what the app dir takes
    },
)
TRTLLM_TARBALL = tarball(
    "TensorRT-LLM-0.12.0", {"examples/llama/convert_checkpoint.py": b"# convert\n", "cpp/big.cu": b"not kept"}
)


def quiet(message: str) -> None:
    pass


@pytest.fixture
def github():
    """GitHub for layout A: the two tarballs on a local HTTP server, and a lock pinning both."""
    with ArchiveServer() as server:
        server.served.update({"/backend.tar.gz": BACKEND_TARBALL, "/trtllm.tar.gz": TRTLLM_TARBALL})
        yield server


def lock_for(server, backend: bytes = BACKEND_TARBALL, trtllm: bytes | None = TRTLLM_TARBALL) -> Lock:
    """A lock pinning what the two tarballs hold (the TensorRT-LLM one not pinned when `trtllm` is None)."""
    backend_paths = ["all_models/inflight_batcher_llm", "all_models/llmapi", "tools"]
    return Lock(
        (
            pinned(server, "triton-inference-server/tensorrtllm_backend", "/backend.tar.gz", backend, backend_paths),
            pinned(server, "NVIDIA/TensorRT-LLM", "/trtllm.tar.gz", trtllm, ["examples"]),
        )
    )


def pinned(server, repo: str, path: str, data: bytes | None, paths: list[str]) -> Pin:
    pin = upstream.new_pin(repo, "v0.12.0", paths)
    pin = replace(pin, url=server.url(path))
    if data is None:
        return pin
    scratch = Path(tempfile.mkdtemp())
    (scratch / "a").write_bytes(data)
    commit, digest = safe_archive.extract(scratch / "a", pin.name, pin.paths, scratch / "tree")
    shutil.rmtree(scratch)
    return replace(pin, commit=commit, digest=digest, uncertain="")


def test_archives_per_layout():
    assert archives(LAYOUT_A) == (
        Archive(
            "triton-inference-server/tensorrtllm_backend",
            "v0.12.0",
            {
                "all_models/inflight_batcher_llm": "all_models/inflight_batcher_llm",
                "all_models/llmapi": "all_models/llmapi",
                "tools": "tools",
            },
        ),
        Archive("NVIDIA/TensorRT-LLM", "v0.12.0", {"examples": "examples"}),
    )
    (only,) = archives(LAYOUT_B)
    assert (only.repo, only.ref) == ("NVIDIA/TensorRT-LLM", "v0.20.0")
    assert only.members["triton_backend/all_models/inflight_batcher_llm"] == "all_models/inflight_batcher_llm"
    assert only.members["triton_backend/tools"] == "tools" and only.members["examples"] == "examples"
    assert local_members(LAYOUT_A)["tensorrt_llm/examples"] == "examples"


def test_lock_paths_are_what_builds_take_plus_the_backend_at_every_ref():
    the_matrix = matrix.load()
    paths = lock_paths(the_matrix)
    for entry in the_matrix.entries:
        assert (entry.backend.repo, entry.backend.ref) in paths
        for archive in archives(entry)[: 1 if entry.backend.in_image else None]:
            assert set(archive.members) <= set(paths[archive.repo, archive.ref])


def test_download_keeps_only_the_app_layout_and_safe_members(github, tmp_path):
    app = fetch(LAYOUT_A, tmp_path / "cache", None, quiet, lock=lock_for(github))
    assert app.parent == tmp_path / "cache" / "backend" / "triton-inference-server" / "tensorrtllm_backend"
    files = sorted(p.relative_to(app).as_posix() for p in app.rglob("*") if p.is_file() or p.is_symlink())
    assert files == [
        "all_models/inflight_batcher_llm/ensemble/config.pbtxt",
        "examples/llama/convert_checkpoint.py",
        "tools/fill_template.py",
        "tools/inside",
        "tools/run.sh",
    ]
    assert (app / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").read_bytes() == CONFIG
    assert (app / "tools/inside").read_text() == "print('fill')\n"
    assert (app / "tools/run.sh").stat().st_mode & 0o111
    assert github.requests == ["/backend.tar.gz", "/trtllm.tar.gz"]


def test_second_fetch_uses_the_verified_cache(github, tmp_path):
    messages = []
    first = fetch(LAYOUT_A, tmp_path, None, messages.append, lock=lock_for(github))
    assert fetch(LAYOUT_A, tmp_path, None, messages.append, lock=lock_for(github)) == first
    assert len(github.requests) == 2 and "cached" in messages[-1]


def test_a_lock_whose_paths_do_not_cover_a_member_names_it(github, tmp_path):
    lock = lock_for(github)
    narrow = Lock((replace(lock.pins[0], paths=("tools",)), lock.pins[1]))
    with pytest.raises(Error, match="does not pin all_models/inflight_batcher_llm, all_models/llmapi"):
        fetch(LAYOUT_A, tmp_path, None, quiet, lock=narrow)
    assert github.requests == []


@pytest.mark.parametrize("damage", ["tampered", "truncated", "interrupted"])
def test_a_damaged_archive_is_never_used_and_nothing_is_published(github, tmp_path, damage):
    if damage == "tampered":
        github.served["/trtllm.tar.gz"] = tarball("TensorRT-LLM-0.12.0", {"examples/evil.py": b"import os\n"})
    elif damage == "truncated":
        github.served["/trtllm.tar.gz"] = TRTLLM_TARBALL[: len(TRTLLM_TARBALL) // 2]
    else:
        github.cut["/trtllm.tar.gz"] = len(TRTLLM_TARBALL) // 2
    lock = lock_for(github)
    with pytest.raises(Error, match="NVIDIA/TensorRT-LLM@v0.12.0"):
        fetch(LAYOUT_A, tmp_path, None, quiet, lock=lock)
    assert not (tmp_path / "backend").exists()
    assert [p.name for p in (tmp_path / "sources").iterdir()] == [lock.pins[0].digest.removeprefix("tree1:")]


def test_unpinned_source_is_trusted_on_first_use_unless_pinned_sources_are_required(github, tmp_path):
    lock = lock_for(github, trtllm=None)
    with pytest.raises(Error, match="NVIDIA/TensorRT-LLM@v0.12.0 is not pinned") as info:
        fetch(LAYOUT_A, tmp_path, None, quiet, lock=lock, require_pinned=True)
    assert "--from-git" in info.value.hint
    assert not (tmp_path / "backend").exists()
    messages: list[str] = []
    app = fetch(LAYOUT_A, tmp_path, None, messages.append, lock=lock)
    assert (app / "examples/llama/convert_checkpoint.py").is_file()
    assert [m for m in messages if m.startswith("trust on first use: NVIDIA/TensorRT-LLM@v0.12.0")]


def test_offline_suggests_backend_dir(github, tmp_path):
    lock = Lock(tuple(dataclasses.replace(pin, url=refused_url()) for pin in lock_for(github).pins))
    with pytest.raises(Error, match="tensorrtllm_backend@v0.12.0") as info:
        fetch(LAYOUT_A, tmp_path, None, quiet, lock=lock)
    assert (
        "--backend-dir DIR (a checkout of triton-inference-server/tensorrtllm_backend at v0.12.0, with its "
        "tensorrt_llm submodule)" in info.value.hint
    )
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_ref_without_templates_is_an_error(github, tmp_path):
    empty = tarball("x", {"tools/fill_template.py": b""})
    github.served["/backend.tar.gz"] = empty
    with pytest.raises(Error, match="all_models/inflight_batcher_llm"):
        fetch(LAYOUT_A, tmp_path, None, quiet, lock=lock_for(github, backend=empty))
    assert [p.name for p in (tmp_path / "backend" / "triton-inference-server" / "tensorrtllm_backend").iterdir()] == []


def make_checkout(root: Path, layout_b: bool) -> Path:
    prefix = root / ("triton_backend" if layout_b else "")
    (prefix / "all_models/inflight_batcher_llm/ensemble").mkdir(parents=True)
    (prefix / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").write_bytes(CONFIG)
    (prefix / "all_models/gpt").mkdir(parents=True)
    (prefix / "tools").mkdir()
    (prefix / "tools/fill_template.py").write_text("")
    examples = root / ("examples" if layout_b else "tensorrt_llm/examples") / "llama"
    examples.mkdir(parents=True)
    (examples / "convert_checkpoint.py").write_text("")
    (examples / "__pycache__").mkdir()
    return root


@pytest.mark.parametrize("entry", [LAYOUT_A, LAYOUT_B], ids=["layout-A", "layout-B"])
def test_local_checkout_is_assembled_into_the_app_layout(entry, tmp_path, github):
    checkout = make_checkout(tmp_path / "checkout", layout_b=bool(entry.backend.subdir))
    app = fetch(entry, tmp_path / "cache", checkout, quiet)
    assert sorted(p.name for p in app.iterdir()) == ["all_models", "examples", "tools"]
    assert [p.name for p in (app / "all_models").iterdir()] == ["inflight_batcher_llm"]
    assert (app / "examples/llama/convert_checkpoint.py").is_file()
    assert not (app / "examples/llama/__pycache__").exists()
    assert github.requests == []  # no network


def test_local_checkout_is_refreshed_on_every_fetch(tmp_path):
    checkout = make_checkout(tmp_path / "checkout", layout_b=False)
    first = fetch(LAYOUT_A, tmp_path / "cache", checkout, quiet)
    (checkout / "tools/new.py").write_text("")
    assert (fetch(LAYOUT_A, tmp_path / "cache", checkout, quiet) / "tools/new.py").is_file()
    assert sorted(p.name for p in first.parent.iterdir()) == ["v0.12.0"]


def test_checkout_without_the_submodule_says_how_to_fix_it(tmp_path):
    checkout = make_checkout(tmp_path / "checkout", layout_b=False)
    for path in sorted((checkout / "tensorrt_llm").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    with pytest.raises(Error, match="examples") as info:
        fetch(LAYOUT_A, tmp_path / "cache", checkout, quiet)
    assert "submodule" in info.value.hint


def test_missing_local_dir_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="not a directory"):
        fetch(LAYOUT_A, tmp_path / "cache", tmp_path / "nope", quiet)
