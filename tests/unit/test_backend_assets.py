"""backend_assets: where the /app layout comes from, offline downloads from local tarballs, local checkouts."""

from __future__ import annotations

import dataclasses
import io
import tarfile
import urllib.error
from pathlib import Path
from types import MappingProxyType

import pytest

from trtllm_images import backend_assets
from trtllm_images.backend_assets import Archive, archives, fetch, local_members
from trtllm_images.errors import BuildError, UsageError
from trtllm_images.matrix import Backend, MatrixEntry

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "upstream"

LAYOUT_A = MatrixEntry(
    tag="24.08", status="supported", note="", triton="2.49.0", tensorrt_llm="0.12.0", tensorrt="10.3.0",
    cuda="12.5.1.007", python="3.10.12", pytorch=None, ubuntu="22.04",
    backend=Backend("triton-inference-server/tensorrtllm_backend", "v0.12.0", "", False), workflows=("engine",),
    engine_deprecated=False, openai_frontend=False, uncertain=MappingProxyType({"pytorch": "test"}), sources=())
LAYOUT_B = dataclasses.replace(LAYOUT_A, tag="25.06", tensorrt_llm="0.20.0",
                               backend=Backend("NVIDIA/TensorRT-LLM", "v0.20.0", "triton_backend", False))


def config_text(version: str) -> bytes:
    """A real template when the shared upstream copies are present; its content is not what is tested."""
    path = SHARED / "tensorrtllm_backend" / version / "inflight_batcher_llm" / "ensemble" / "config.pbtxt"
    return path.read_bytes() if path.is_file() else b'name: "ensemble"\n'


def tarball(top: str, files: dict[str, bytes], symlinks: dict[str, str] = ()) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name if name.startswith(("/", "..")) else f"{top}/{name}")
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in dict(symlinks).items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


@pytest.fixture
def github(monkeypatch):
    """Serves tarballs by URL from a dict; records the URLs asked for."""
    served: dict[str, bytes] = {}
    asked: list[str] = []

    def open_url(url):
        asked.append(url)
        if url not in served:
            raise urllib.error.URLError("Temporary failure in name resolution")
        return io.BytesIO(served[url])

    monkeypatch.setattr(backend_assets, "_open_url", open_url)
    return served, asked


def serve_layout_a(served):
    served["https://codeload.github.com/triton-inference-server/tensorrtllm_backend/tar.gz/v0.12.0"] = tarball(
        "tensorrtllm_backend-0.12.0", {
            "all_models/inflight_batcher_llm/ensemble/config.pbtxt": config_text("v0.12.0"),
            "all_models/gpt/model.py": b"not kept",
            "tools/fill_template.py": b"print('fill')\n",
            "tools/run.sh": b"#!/bin/sh\n",
            "docs/README.md": b"not kept",
            "../escape.txt": b"must not be written",
            "/etc/absolute.txt": b"must not be written",
        }, symlinks={"tools/inside": "fill_template.py", "tools/outside": "../../../../etc/passwd",
                     "tools/absolute": "/etc/passwd"})
    served["https://codeload.github.com/NVIDIA/TensorRT-LLM/tar.gz/v0.12.0"] = tarball(
        "TensorRT-LLM-0.12.0", {"examples/llama/convert_checkpoint.py": b"# convert\n", "cpp/big.cu": b"not kept"})


def test_archives_per_layout():
    assert archives(LAYOUT_A) == (
        Archive("triton-inference-server/tensorrtllm_backend", "v0.12.0", {
            "all_models/inflight_batcher_llm": "all_models/inflight_batcher_llm",
            "all_models/llmapi": "all_models/llmapi", "tools": "tools"}),
        Archive("NVIDIA/TensorRT-LLM", "v0.12.0", {"examples": "examples"}))
    (only,) = archives(LAYOUT_B)
    assert (only.repo, only.ref) == ("NVIDIA/TensorRT-LLM", "v0.20.0")
    assert only.members["triton_backend/all_models/inflight_batcher_llm"] == "all_models/inflight_batcher_llm"
    assert only.members["triton_backend/tools"] == "tools" and only.members["examples"] == "examples"
    assert local_members(LAYOUT_A)["tensorrt_llm/examples"] == "examples"


def test_download_keeps_only_the_app_layout_and_safe_members(github, tmp_path):
    served, asked = github
    serve_layout_a(served)
    app = fetch(LAYOUT_A, tmp_path / "cache", None, lambda message: None)
    assert app == tmp_path / "cache" / "backend" / "triton-inference-server" / "tensorrtllm_backend" / "v0.12.0"
    files = sorted(p.relative_to(app).as_posix() for p in app.rglob("*") if p.is_file() or p.is_symlink())
    assert files == ["all_models/inflight_batcher_llm/ensemble/config.pbtxt", "examples/llama/convert_checkpoint.py",
                     "tools/fill_template.py", "tools/inside", "tools/run.sh"]
    assert (app / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").read_bytes() == config_text("v0.12.0")
    assert (app / "tools/inside").read_text() == "print('fill')\n"
    assert (app / "tools/run.sh").stat().st_mode & 0o111
    assert not list(tmp_path.rglob("escape.txt")) and not list(tmp_path.rglob("absolute.txt"))
    assert asked == ["https://codeload.github.com/triton-inference-server/tensorrtllm_backend/tar.gz/v0.12.0",
                     "https://codeload.github.com/NVIDIA/TensorRT-LLM/tar.gz/v0.12.0"]


def test_second_fetch_uses_the_cache(github, tmp_path):
    served, asked = github
    serve_layout_a(served)
    messages = []
    first = fetch(LAYOUT_A, tmp_path, None, messages.append)
    assert fetch(LAYOUT_A, tmp_path, None, messages.append) == first
    assert len(asked) == 2 and "cached" in messages[-1]


def test_network_failure_names_the_url_and_suggests_backend_dir(github, tmp_path):
    with pytest.raises(BuildError, match="codeload.github.com/triton-inference-server") as info:
        fetch(LAYOUT_A, tmp_path, None, lambda message: None)
    assert "--backend-dir" in info.value.hint
    root = tmp_path / "backend" / "triton-inference-server" / "tensorrtllm_backend"
    assert list(root.iterdir()) == []    # no half download, no temp dir


def test_truncated_tarball_is_an_error_and_caches_nothing(github, tmp_path):
    served, _ = github
    serve_layout_a(served)
    url = "https://codeload.github.com/NVIDIA/TensorRT-LLM/tar.gz/v0.12.0"
    served[url] = served[url][: len(served[url]) // 2]
    with pytest.raises(BuildError, match="cannot download"):
        fetch(LAYOUT_A, tmp_path, None, lambda message: None)
    assert list((tmp_path / "backend" / "triton-inference-server" / "tensorrtllm_backend").iterdir()) == []


def test_a_ref_without_templates_is_an_error(github, tmp_path):
    served, _ = github
    serve_layout_a(served)
    url = "https://codeload.github.com/triton-inference-server/tensorrtllm_backend/tar.gz/v0.12.0"
    served[url] = tarball("x", {"tools/fill_template.py": b""})
    with pytest.raises(BuildError, match="all_models/inflight_batcher_llm"):
        fetch(LAYOUT_A, tmp_path, None, lambda message: None)


def make_checkout(root: Path, layout_b: bool) -> Path:
    prefix = root / ("triton_backend" if layout_b else "")
    (prefix / "all_models/inflight_batcher_llm/ensemble").mkdir(parents=True)
    (prefix / "all_models/inflight_batcher_llm/ensemble/config.pbtxt").write_bytes(config_text("v0.13.0"))
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
    app = fetch(entry, tmp_path / "cache", checkout, lambda message: None)
    assert sorted(p.name for p in app.iterdir()) == ["all_models", "examples", "tools"]
    assert [p.name for p in (app / "all_models").iterdir()] == ["inflight_batcher_llm"]
    assert (app / "examples/llama/convert_checkpoint.py").is_file()
    assert not (app / "examples/llama/__pycache__").exists()
    assert github[1] == []     # no network


def test_local_checkout_is_refreshed_on_every_fetch(tmp_path):
    checkout = make_checkout(tmp_path / "checkout", layout_b=False)
    first = fetch(LAYOUT_A, tmp_path / "cache", checkout, lambda message: None)
    (checkout / "tools/new.py").write_text("")
    assert (fetch(LAYOUT_A, tmp_path / "cache", checkout, lambda message: None) / "tools/new.py").is_file()
    assert sorted(p.name for p in first.parent.iterdir()) == ["v0.12.0"]


def test_checkout_without_the_submodule_says_how_to_fix_it(tmp_path):
    checkout = make_checkout(tmp_path / "checkout", layout_b=False)
    for path in sorted((checkout / "tensorrt_llm").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    with pytest.raises(BuildError, match="examples") as info:
        fetch(LAYOUT_A, tmp_path / "cache", checkout, lambda message: None)
    assert "submodule" in info.value.hint


def test_missing_local_dir_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="not a directory"):
        fetch(LAYOUT_A, tmp_path / "cache", tmp_path / "nope", lambda message: None)
