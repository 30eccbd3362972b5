"""harness/build_standin.py without Docker: which upstream files a tag's stand-in takes (and nothing else), the step
lines and the heartbeat, and one line when no Docker engine answers."""

from __future__ import annotations

import time
from pathlib import Path
from types import MappingProxyType

from harness import build_standin
from trtllm_images.matrix import load
from trtllm_images.sources import upstream
from trtllm_images.sources.upstream import Lock, Pin


def _backend_pin(ref: str) -> Pin:
    return Pin(
        "triton-inference-server/tensorrtllm_backend",
        ref,
        "https://example.invalid",
        ("all_models/inflight_batcher_llm",),
        layout=MappingProxyType({"all_models/inflight_batcher_llm": f"tensorrtllm_backend/{ref}/inflight_batcher_llm"}),
    )


def test_a_stand_in_needs_its_template_set_and_the_frontend_sources_only():
    matrix = load()
    assert build_standin.upstream_needs(matrix.get("25.01")) == ("tensorrtllm_backend/v0.17.0", "triton")
    assert build_standin.upstream_needs(matrix.get("26.07")) == ("tensorrt_llm/triton_backend/all_models", "triton")
    old = [e for e in matrix.entries if not e.backend.in_image and not e.openai_frontend]
    assert old and build_standin.upstream_needs(old[0]) == (), "no /app and no frontend: no upstream files at all"


def test_the_template_set_is_the_newest_pinned_one_not_newer_than_the_version():
    lock = Lock(tuple(_backend_pin(ref) for ref in ("v0.8.0", "v0.12.0", "v0.17.0")))
    assert build_standin.templates_need("0.16.0", lock) == "tensorrtllm_backend/v0.12.0"
    assert build_standin.templates_need("0.17.0", lock) == "tensorrtllm_backend/v0.17.0"
    assert build_standin.templates_need("0.7.1", lock) is None
    assert build_standin.templates_need("1.2.1", lock) == "tensorrt_llm/triton_backend/all_models"
    assert build_standin.templates_need("0.17.0") == "tensorrtllm_backend/v0.17.0"  # the committed lock
    assert upstream.load_lock().pins


def test_the_heartbeat_says_which_part_of_a_step_runs_until_it_ends():
    said: list[str] = []
    with build_standin.heartbeat(said.append, "building X", every=0.05) as state:
        state["now"] = "Step 3/9 : RUN pip install"
        time.sleep(0.18)
    count = len(said)
    time.sleep(0.1)
    assert count >= 2 and len(said) == count, "beats while the step runs, none after"
    assert all(line.startswith("  still building X (Step 3/9 : RUN pip install): ") for line in said), said


def test_the_models_label_names_the_set_inside_the_upstream_layout():
    spec = build_standin.StandinSpec(
        "25.01",
        "trtllm-standin:25.01",
        "2.54.0",
        "0.17.0",
        "10.7",
        True,
        True,
        Path("/somewhere/upstream/tensorrtllm_backend/v0.17.0"),
    )
    assert spec.models_set == "tensorrtllm_backend/v0.17.0"


def test_without_a_docker_engine_the_build_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert build_standin.main(["--tag", "25.01"]) == 1
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == err.strip().splitlines()[-1:]
    assert "no Docker engine answers" in err and "Traceback" not in err
