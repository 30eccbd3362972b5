"""Byte-exact upstream files for the tests (backend config.pbtxt templates, KServe and scale-out CRDs), never kept in
this repository.

They come from the first of:
  1. $TRTLLM_UPSTREAM_DIR, a copy with the layout below;
  2. ../shared/upstream beside the repository (or beside the main checkout of a git worktree), where present;
  3. the verified download cache: the sources of upstream.lock.json, fetched from GitHub on first use and verified
     by content; a source the lock does not pin yet is trusted on first use, with a line on stderr saying so
     (`python build.py upstream fetch` does it ahead and prints the directory; `--out DIR` copies it there to
     carry to a machine without GitHub). Only the sources that lay out what is asked for are fetched, so a test
     of one template set, or a stand-in of one tag, never waits for a CRD.

Layout of a copy (paths in the archives on the right):
  tensorrtllm_backend/<ref>/inflight_batcher_llm/…   tensorrtllm_backend@<ref>: all_models/inflight_batcher_llm
  tensorrt_llm/triton_backend/all_models/…             TensorRT-LLM: triton_backend/all_models/{inflight_batcher_llm,
                                                                                                   llmapi}
  kserve/crd/serving.kserve.io_*.yaml                  kserve@v0.20.0: config/crd/full/
  lws/leaderworkerset.x-k8s.io_leaderworkersets.yaml   lws@v0.10.0: config/crd/bases/
  prometheus-operator/monitoring.coreos.com_podmonitors.yaml
                                                       prometheus-operator@v0.93.0:
                                                       example/prometheus-operator-crd-full/
  keda/keda.sh_scaledobjects.yaml                      keda@v2.20.2: config/crd/bases/
  triton/core-r24.10/{include/…/tritonserver.h,python/tritonserver/}
                                                       triton-inference-server/core@r24.10
  triton/server-r24.12/python/openai/{openai_frontend/,requirements.txt}
                                                       triton-inference-server/server@r24.12

None available: the test skips with one line saying how to get them; under CI=true it fails instead (no test that
needs upstream files skips in CI).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

from trtllm_entrypoint.errors import Error
from trtllm_images.sources import cache as source_cache
from trtllm_images.sources import upstream

ENV = "TRTLLM_UPSTREAM_DIR"
REPO = Path(__file__).resolve().parents[1]
HOW = (
    f"set {ENV} to a copy (layout in harness/upstream_files.py): `python build.py upstream fetch --out DIR` "
    "on a machine that reaches GitHub makes one to carry"
)


def _main_checkout(repo: Path) -> Path:
    """The main checkout of a linked git worktree (its .git is a file naming the main one's git dir), else `repo`."""
    dot_git = repo / ".git"
    if not dot_git.is_file():
        return repo
    gitdir = Path(dot_git.read_text().partition("gitdir:")[2].strip())
    common = gitdir / "commondir"  # <main>/.git/worktrees/<name>/commondir -> ../..
    if not common.is_file():
        return repo
    return (gitdir / common.read_text().strip()).resolve().parent


SHARED = _main_checkout(REPO).parent / "shared" / "upstream"


class UpstreamMissing(Exception):
    """No source has the upstream files; the message says how to get them."""


def upstream_root(needs: tuple[str, ...] = ()) -> Path:
    """The directory holding the upstream layout, from the first source that has one; `needs` (paths in the layout)
    limits what the pinned sources download to the sources that lay them out."""
    found = _resolve(needs)
    if isinstance(found, str):
        raise UpstreamMissing(found)
    return found


@functools.cache
def _resolve(needs: tuple[str, ...] = ()) -> Path | str:
    """The root, or why there is none: cached either way, so an offline machine tries the network once."""
    if os.environ.get(ENV):
        root = Path(os.environ[ENV])
        return root if root.is_dir() else f"{ENV}={root} is not a directory; {HOW}"
    if SHARED.is_dir():
        return SHARED
    pinned = _pinned_layout(needs)
    return pinned if isinstance(pinned, Path) else f"upstream files unavailable: {pinned}; {HOW}"


def _tell(message: str) -> None:
    """Downloads and trust-on-first-use records show on the real stderr, whatever pytest captures."""
    print(f"upstream files: {message}", file=sys.__stderr__, flush=True)


@functools.cache
def _pinned_layout(needs: tuple[str, ...] = ()) -> Path | str:
    """The layout made from the lock's pinned sources (downloaded once), or why there is none."""
    try:
        return source_cache.materialize_layout(
            upstream.load_lock(), source_cache.cache_root(), local_copy=f"{ENV}=<a copy>", log=_tell, needs=needs
        )
    except Error as exc:
        return f"the pinned sources are unavailable ({exc.message})"


def find(relpath: str) -> Path:
    """upstream_root() / relpath; a file that copy lacks (one added to the lock after it was made) comes from the
    lock's pinned sources instead; else UpstreamMissing naming what is missing where."""
    root = upstream_root((relpath,))
    path = root / relpath
    if path.exists():
        return path
    pinned = _pinned_layout((relpath,))
    if isinstance(pinned, Path) and pinned != root and (pinned / relpath).exists():
        return pinned / relpath
    where = f"and from {pinned}" if isinstance(pinned, Path) else f"and {pinned}"
    raise UpstreamMissing(f"{relpath} is missing from {root} {where}; {HOW}")


def upstream_path(relpath: str) -> Path:
    """For tests: find(relpath), or skip (fail under CI=true, where the whole suite must run) with one line."""
    try:
        return find(relpath)
    except UpstreamMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, so upstream files are required: {exc}", pytrace=False)
        pytest.skip(str(exc))
