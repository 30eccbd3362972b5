"""Whether this image serves the configured model, checked before any download or build, the entrypoint in a real
process: refusals name the tags that serve it.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.fake_hub import FakeHub
from harness.image import Image, records
from harness.tiny_checkpoint import tiny_llama

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


PHI3 = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 32,
}


def phi3_checkpoint(root: Path) -> Path:
    model = tiny_llama(root / "models" / "phi3")
    (model / "config.json").write_text(json.dumps(PHI3))
    return model


def test_a_model_newer_than_the_image_exits_2_naming_the_tags_that_serve_it(tmp_path):
    img = Image(tmp_path, "24.05", None)
    result = img.run("prepare", MODEL_ID=str(phi3_checkpoint(tmp_path)))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: Phi3ForCausalLM (model_type phi3) needs TensorRT-LLM 0.10.0 or later for "
        "WORKFLOW=engine (tags 24.06 and later); this image (24.05) has TensorRT-LLM 0.9.0"
    ]
    assert img.builds() == 0 and records(img.records, "convert_checkpoint") == []
    assert not img.cache.exists() and not img.repo.exists()


def test_check_reports_that_the_configured_model_is_not_served(tmp_path):
    img = Image(tmp_path, "24.05", None)
    result = img.run("check", MODEL_ID=str(phi3_checkpoint(tmp_path)), NVIDIA_VISIBLE_DEVICES="all")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["model"]["model"] == "Phi3ForCausalLM (model_type phi3)"
    assert "needs TensorRT-LLM 0.10.0 or later" in report["model"]["problem"]
    assert "tags 24.06 and later" in result.stderr
    ok = Image(tmp_path / "newer", "24.06", None).run("check", MODEL_ID=str(phi3_checkpoint(tmp_path / "newer")))
    assert json.loads(ok.stdout)["model"]["problem"] is None


def test_a_hub_model_is_refused_after_fetching_its_config_alone(tmp_path):
    pytest.importorskip("huggingface_hub")
    hub = FakeHub(
        "microsoft/Phi-3-mini-4k-instruct",
        {"config.json": json.dumps(PHI3).encode(), "model.safetensors": b"weights" * 1000},
    )
    try:
        img = Image(tmp_path, "24.05", None)
        result = img.run(
            "prepare", MODEL_ID="microsoft/Phi-3-mini-4k-instruct", HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1"
        )
    finally:
        hub.close()
    assert result.returncode == 2, result.stderr
    assert "error: Phi3ForCausalLM (model_type phi3) needs TensorRT-LLM 0.10.0" in result.stderr
    assert any("config.json" in request for request in hub.requests), hub.requests
    probe = "HEAD /api/models/microsoft/Phi-3-mini-4k-instruct"  # hub_reach's one probe before the client
    assert not [r for r in hub.requests if "config.json" not in r and r != probe], "only config.json was asked for"
    assert not list(img.cache.rglob("*.safetensors*")), "no weights were downloaded"
    assert img.builds() == 0
