"""The container code under each library release line an image carries (tests/library_versions.yaml): the
entrypoint's hub calls, the OpenAI front's token counts and chat templates, each run by that env's own Python.

The venvs are built once into the cache (harness/library_envs.py; .ci/run builds them before the tests); a point whose
Python this machine lacks skips with one line (under CI=true .ci/run must allow that skip)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness import library_envs
from harness.fake_hub import FakeHub
from harness.image import Image, templates_for
from harness.tiny_checkpoint import tiny_llama

pytestmark = pytest.mark.process

POINTS = library_envs.points()
LIMIT_S = 5.0  # an unreachable or failing hub is named within this, interpreter start included
CHECK = Path(library_envs.__file__).with_name("library_check.py")


@pytest.fixture(scope="module", params=POINTS, ids=[point.name for point in POINTS])
def python(request) -> Path:
    try:
        return library_envs.ensure(request.param)
    except library_envs.LibraryEnvUnavailable as exc:
        pytest.skip(str(exc))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prepare(python: Path, image: Image, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [str(python), "-m", "trtllm_entrypoint", "prepare"],
        env={**image.env, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - started


def _one_error(result: subprocess.CompletedProcess) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ") or " error: " in line]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Retrying" not in result.stderr, result.stderr
    return errors[0]


@pytest.fixture
def image(tmp_path) -> Image:
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


def test_an_unreachable_hub_is_one_line_within_5_s(python, image):
    result, elapsed = _prepare(python, image, MODEL_ID="org/name", HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    assert result.returncode == 1, result.stderr
    assert "Hugging Face hub cannot be reached" in _one_error(result)
    assert elapsed < LIMIT_S, f"{elapsed:.1f} s under {python}"


def test_a_failing_hub_is_one_line_with_its_status_within_5_s(python, image):
    hub = FakeHub("org/name", {}, override=lambda path: (503, {}, b"busy"))
    try:
        result, elapsed = _prepare(python, image, MODEL_ID="org/name", HF_ENDPOINT=hub.url)
    finally:
        hub.close()
    assert result.returncode == 1, result.stderr
    assert "HTTP status 503" in _one_error(result)
    assert elapsed < LIMIT_S, f"{elapsed:.1f} s under {python}"


def test_a_model_missing_on_the_hub_is_a_usage_error_naming_it(python, image):
    hub = FakeHub("org/name", {})
    try:
        result, _ = _prepare(python, image, MODEL_ID="org/other", HF_ENDPOINT=hub.url)
    finally:
        hub.close()
    assert result.returncode == 2, result.stderr
    assert "org/other" in _one_error(result)  # a bare 404 (this hub sends no X-Error-Code): named with its status


def test_a_hub_model_is_fetched_and_prepared(python, image, tmp_path):
    model = tiny_llama(tmp_path / "hub-model")
    files = {path.name: path.read_bytes() for path in model.iterdir()}
    hub = FakeHub("org/name", files)
    try:
        result, _ = _prepare(python, image, MODEL_ID="org/name", HF_ENDPOINT=hub.url, WORKFLOW="engine")
    finally:
        hub.close()
    assert result.returncode == 0, result.stderr
    assert f"commit={FakeHub.COMMIT}" in result.stderr or FakeHub.COMMIT in result.stdout, result.stderr
    snapshot = image.cache / "models" / "hub" / "models--org--name" / "snapshots" / FakeHub.COMMIT
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(files)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> tuple[Path, Path]:
    """A tokenizer.json tokenizer (the fast path), and one with only a WordPiece vocabulary (transformers' path),
    each with the eos token the front's loader needs (the engine stops there)."""
    root = tmp_path_factory.mktemp("tokenizers")
    fast = tiny_llama(root / "fast")
    slow = root / "slow"
    slow.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "what", "is", "tensor", "##rt", "-", "ll", "##m", "?", "triton"]
    (slow / "vocab.txt").write_text("\n".join(words) + "\n")
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "eos_token": "[SEP]"}
    (slow / "tokenizer_config.json").write_text(json.dumps(config))
    return fast, slow


@pytest.fixture(scope="module")
def answers(tokenizers) -> dict[str, dict]:
    """library_check.py's answers under every env that this machine can build."""
    out = {}
    for point in POINTS:
        try:
            python = library_envs.ensure(point)
        except library_envs.LibraryEnvUnavailable:
            continue
        done = subprocess.run(
            [str(python), str(CHECK), *map(str, tokenizers)],
            env={"PYTHONPATH": str(library_envs.REPO / "entrypoints"), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{point.name}: {done.stderr[-2000:]}"
        out[point.name] = json.loads(done.stdout)
    if len(out) < 2:
        pytest.skip(f"fewer than two library envs can be built here ({sorted(out)}): nothing to compare")
    return out


def test_each_env_runs_the_versions_the_data_file_names(answers):
    for point in POINTS:
        if point.name in answers:
            got = answers[point.name]["versions"]
            assert [f"{name}=={got[name]}" for name in ("huggingface_hub", "transformers")] == list(
                point.requirements[:2]
            ), point.name
            assert answers[point.name]["python"] == point.python


@pytest.mark.parametrize("field", ["tokens_fast", "tokens_slow", "templates", "template_from_files"])
def test_tokens_and_templates_are_the_same_under_every_release_line(answers, field):
    first, *rest = answers.items()
    for name, answer in rest:
        assert answer[field] == first[1][field], f"{name} differs from {first[0]}"


def test_the_answers_are_the_expected_ones(answers):
    answer = next(iter(answers.values()))
    assert answer["tokens_fast"] == [6, 12, 0]
    assert answer["tokens_slow"][0] > 2 and answer["tokens_slow"][2] == 2  # [CLS] … [SEP]; empty: both alone
    assert answer["templates"]["alternating"].startswith("refused: the chat template refused the messages: ")
    assert answer["templates"]["header-style"] == (
        "<s><|start|>system<|sep|>Be brief.<|end|>\n<|start|>user<|sep|>What is TensorRT-LLM?<|end|>\n"
        '<|start|>assistant<|sep|>A library.<|end|>\n<|start|>user<|sep|>And "Triton"? é ü<|end|>\n'
        "<|start|>assistant<|sep|>"
    )
    assert answer["templates"]["alternating/no-system"] == (
        "<s>[INST] What is TensorRT-LLM? [/INST]<!-- 1 turns, 1 messages -->"
    )
