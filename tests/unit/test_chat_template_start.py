"""A model whose chat template does not compile is refused at start, as a user starts the container: one line, exit
2, before anything is written or built; with FRONTEND=triton (the image's own renderer) it is none of ours."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.fake_hub import FakeHub
from harness.image import Image, templates_for
from harness.tiny_checkpoint import tiny_llama

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process

BROKEN = "{% for message in messages %}{{ message['content'] }}{% endfor"  # no closing `%}`
REAL = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{% generation %}{{ m.content }}"
REAL += "{% endgeneration %}{% endfor %}{{ strftime_now('%d %b %Y') }}{{ {'a': 'é'} | tojson(ensure_ascii=False) }}"


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


def with_template(image: Image, text: str) -> None:
    (image.model / "chat_template.jinja").write_text(text, encoding="utf-8")


@pytest.mark.parametrize("command", ["prepare", "serve"])
def test_a_template_that_does_not_compile_stops_the_start_with_one_line(image, command):
    with_template(image, BROKEN)
    result = image.run(command, FRONTEND="openai")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, result.stderr
    assert f"{image.model}/chat_template.jinja does not compile" in lines[0]
    assert "Traceback" not in result.stderr
    # Refused before the engine build and the repository: nothing was written.
    assert image.builds() == 0 and not image.repo.exists()
    assert not (image.cache / "engines").exists()


def test_a_template_with_transformers_features_starts(image):
    with_template(image, REAL)
    result = image.run("prepare", FRONTEND="openai")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["front"]


def test_the_triton_frontend_does_not_check_our_environment(image):
    with_template(image, BROKEN)
    result = image.run("prepare")
    assert result.returncode == 0, result.stderr


def test_without_a_template_chat_is_refused_later_not_the_start(image):
    config = json.loads((image.model / "tokenizer_config.json").read_text())
    assert "chat_template" not in config and not (image.model / "chat_template.jinja").exists()
    result = image.run("prepare", FRONTEND="openai")
    assert result.returncode == 0, result.stderr
    assert "no chat_template" in result.stderr


def test_a_prebuilt_engine_with_a_broken_template_beside_it_is_refused(image):
    engine = image.prebuilt()
    (engine / "chat_template.jinja").write_text(BROKEN)
    shutil.rmtree(image.model)
    result = image.run("prepare", FRONTEND="openai", MODEL_ID=str(engine))
    assert result.returncode == 2, result.stderr
    assert f"{engine}/chat_template.jinja does not compile" in result.stderr


def test_a_hub_model_with_a_broken_template_is_refused_before_its_weights_are_downloaded(tmp_path):
    pytest.importorskip("huggingface_hub")
    model = tiny_llama(tmp_path / "source")
    files = {path.name: path.read_bytes() for path in sorted(model.iterdir())}
    files["chat_template.jinja"] = BROKEN.encode()
    hub = FakeHub("org/tiny-llama", files)
    try:
        image = Image(tmp_path / "image", "25.01", templates_for("v0.17.0"))
        result = image.run(
            "prepare", FRONTEND="openai", MODEL_ID="org/tiny-llama", HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1"
        )
    finally:
        hub.close()
    assert result.returncode == 2, result.stderr
    assert "chat_template.jinja does not compile" in result.stderr and "Traceback" not in result.stderr
    assert image.builds() == 0 and not image.repo.exists()
    assert not list(image.cache.rglob("*.safetensors")), "the weights were not downloaded"
    assert not [r for r in hub.requests if r.endswith(".safetensors")], hub.requests


def test_a_hub_model_with_a_real_template_is_checked_once_and_served(tmp_path):
    pytest.importorskip("huggingface_hub")
    model = tiny_llama(tmp_path / "source")
    files = {path.name: path.read_bytes() for path in sorted(model.iterdir())}
    files["chat_template.jinja"] = REAL.encode()
    hub = FakeHub("org/tiny-llama", files)
    try:
        image = Image(tmp_path / "image", "25.01", templates_for("v0.17.0"))
        result = image.run(
            "prepare", FRONTEND="openai", MODEL_ID="org/tiny-llama", HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1"
        )
    finally:
        hub.close()
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("chat template default from") == 1, result.stderr
    assert json.loads(result.stdout)["front"]["plan"]["served_name"] == "org/tiny-llama"
