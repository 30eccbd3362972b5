"""What the entrypoint's output says and never says, in a real process: tokens and admin keys masked everywhere,
JSON lines with phases, warnings about open APIs and misspelt variables, download progress.

The NVIDIA programs are the doubles from tests/doubles (on PATH / PYTHONPATH); what is asserted is our behaviour:
exit codes, messages, the files we write, and the arguments we gave the programs.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from harness.fake_hub import FakeHub
from harness.image import Image, templates_for
from harness.tiny_checkpoint import tiny_llama

pytestmark = pytest.mark.process  # each test runs the entrypoint as its own process


def test_token_never_appears_in_output_or_files(image):
    token = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    result = image.run("prepare", HF_TOKEN=token, LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    assert_secret_nowhere(token, image, result)


def assert_secret_nowhere(secret: str, image: Image, result: subprocess.CompletedProcess) -> None:
    assert secret not in result.stdout + result.stderr
    for path in [*image.cache.rglob("*"), *image.repo.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_json_logs_are_one_object_per_line_with_phase_durations(image):
    result = image.run("prepare", LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    phases = {e["phase"]: e for e in events if e.get("msg") == "phase done"}
    assert {"resolve", "engine", "fill"} <= set(phases)
    assert all(isinstance(e["seconds"], float) for e in phases.values())


def test_a_misspelt_variable_is_warned_about_by_name_and_refused_with_strict_env(image):
    warned = image.run("check", MAX_BATCH_SIZ="8", DECOUPLE="true")
    assert warned.returncode == 0, warned.stderr
    assert "ignoring MAX_BATCH_SIZ (did you mean MAX_BATCH_SIZE?)" in warned.stderr
    assert "ignoring DECOUPLE (did you mean DECOUPLED?)" in warned.stderr
    refused = image.run("prepare", MAX_BATCH_SIZ="8", STRICT_ENV="true")
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: not a variable trtllm-entrypoint reads: MAX_BATCH_SIZ (did you mean")
    assert image.builds() == 0


def test_error_lines_mask_a_token_given_in_a_file(image, tmp_path):
    token = "hf_filetokenfiletokenfiletoken12"
    (tmp_path / "token").write_text(token + "\n")
    result = image.run("prepare", HF_TOKEN_FILE=str(tmp_path / "token"), MODEL_ID=f"{token} x")
    assert result.returncode == 2
    assert token not in result.stderr and "***" in result.stderr


ADMIN_KEY = "admin-key-0123456789abcdef"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_admin_key_is_masked_in_prepare_output_logs_and_files(image, tmp_path, log_format):
    (tmp_path / "admin-key").write_text(ADMIN_KEY + "\n")
    result = image.run("prepare", TRITON_ADMIN_KEY_FILE=str(tmp_path / "admin-key"), LOG_FORMAT=log_format)
    assert result.returncode == 0, result.stderr
    assert_secret_nowhere(ADMIN_KEY, image, result)
    argv = json.loads(result.stdout)["argv"]
    apis = "shared-memory,model-repository,statistics,trace,logging"
    # The key's value is masked in prepare's output: each restriction flag appears once, with nothing after "=".
    restricted = [arg for arg in argv if arg.startswith(("--http-restricted", "--grpc-restricted"))]
    assert restricted == [f"--http-restricted-api={apis}:admin-key=", f"--grpc-restricted-protocol={apis}:admin-key="]
    assert f"--http-restricted-api={apis}:admin-key=***" in result.stderr  # the logged launch command


def test_restricted_apis_none_opens_them_with_a_warning(image):
    result = image.run("prepare", RESTRICTED_APIS="none")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    assert not any(arg.startswith(("--http-restricted", "--grpc-restricted")) for arg in argv), argv
    assert "warning: RESTRICTED_APIS=none: every Triton API" in result.stderr


def test_a_routine_start_logs_only_the_parameters_the_user_set_and_check_lists_every_one(image):
    quiet = image.run("prepare", KV_CACHE_FREE_GPU_MEM_FRACTION="0.5")
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stderr.splitlines()
    (summary,) = [line for line in lines if "template parameters" in line]
    assert "kv_cache_free_gpu_mem_fraction=0.5" in summary and "backend_defaults=" in summary
    assert "unset (backend default)" not in quiet.stderr and "batching_strategy" not in summary
    # The engine build's command lines and the launch command are for LOG_LEVEL=debug.
    assert not [line for line in lines if "running" in line and "--checkpoint_dir" in line]
    # Another engine, so that it is built again, this time with the verbose log.
    verbose = image.run("prepare", KV_CACHE_FREE_GPU_MEM_FRACTION="0.5", MAX_BEAM_WIDTH="2", LOG_LEVEL="debug")
    assert "debug: optional template parameters" in verbose.stderr and "batching_strategy=" in verbose.stderr
    assert "debug: running step=trtllm-build command=trtllm-build --checkpoint_dir" in verbose.stderr
    report = json.loads(image.run("check", KV_CACHE_FREE_GPU_MEM_FRACTION="0.5").stdout)
    parameters = report["template_parameters"]
    assert parameters["kv_cache_free_gpu_mem_fraction"] == "0.5"
    assert parameters["batching_strategy"] == "inflight_fused_batching"
    assert parameters["max_attention_window_size"] == "unset (backend default)"


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_hub_download_logs_its_progress_and_a_summary_without_bars_or_secrets(tmp_path, log_format):
    pytest.importorskip("huggingface_hub")
    token = "hf_progressDoNotLeak0123456789"
    model = tiny_llama(tmp_path / "source")
    files = {path.name: path.read_bytes() for path in sorted(model.iterdir())}
    hub = FakeHub("org/tiny-llama", files, seconds_per_file=2.5)
    try:
        img = Image(tmp_path / "image", "25.01", templates_for("v0.17.0"))
        result = img.run(
            "prepare",
            MODEL_ID="org/tiny-llama",
            HF_ENDPOINT=hub.url,
            HF_TOKEN=token,
            HF_HUB_DISABLE_TELEMETRY="1",
            PROGRESS_INTERVAL_SECS="1",
            LOG_FORMAT=log_format,
        )
    finally:
        hub.close()
    assert result.returncode == 0, result.stderr
    assert any(h.get("authorization") == f"Bearer {token}" for h in hub.headers), "the token was sent to the hub"
    assert token not in result.stderr + result.stdout and "\r" not in result.stderr
    lines = result.stderr.splitlines()
    if log_format == "json":
        events = [json.loads(line) for line in lines]
    else:
        events = [
            {"msg": line.split(": ", 1)[1].split(" repo_id=")[0], **dict(re.findall(r" (\w+)=(\S+)", line))}
            for line in lines
            if " repo_id=" in line
        ]
    progress = [e for e in events if e["msg"] == "downloading" and "percent" in e]
    assert len(progress) >= 2, lines
    for event in progress:
        done, total = str(event["files"]).split("/")
        assert total == str(len(files)) and 0 <= int(done) <= len(files)
        assert str(event["bytes"]).endswith(f"/{sum(map(len, files.values())) / 1000:.1f}KB")
        assert 0 <= float(event["percent"]) <= 100 and str(event["rate"]).endswith("/s") and "elapsed_s" in event
    assert [float(e["percent"]) for e in progress] == sorted(float(e["percent"]) for e in progress)
    (summary,) = [e for e in events if e["msg"] == "download done"]
    assert str(summary["files"]) == str(len(files)) and float(summary["seconds"]) >= 2
    # The downloaded weights are what was built: the engine workflow ran on the fetched snapshot.
    assert img.builds() == 1
