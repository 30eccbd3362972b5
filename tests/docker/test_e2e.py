"""End to end against a real Docker engine: `python build.py` builds our images FROM stand-in NGC images, and
`docker run` serves a tiny checkpoint through the entrypoint. The NVIDIA programs are doubles that record how they
were called; the assertions are about what OUR code asked of them and how our containers behave.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.docker.conftest import (
    E2E_TOKEN,
    FAST_HEALTHCHECK,
    logs,
    matrix_for_standin,
    record_mount,
    run_build,
    wait_health_status,
    wait_ready,
)
from tests.doubles.double_records import parse_flags, read_records

NEW_TAG = "25.01"   # the image ships /app (templates, examples)
OLD_TAG = "24.08"   # no /app: build.py bakes the backend assets from --backend-dir
CACHE = "/var/cache/trtllm"
STOCK_KSERVE_ARGS = ["tritonserver", "--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080",
                     "--allow-grpc=true", "--allow-http=true"]


def flags_of(entry: dict) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_flags(entry["argv"]).items()}


def serve(containers, image, model, records, *, cache=None, env=None, **kwargs):
    volumes = {str(model): {"bind": "/models/tiny", "mode": "ro"}, **record_mount(records)}
    if cache:
        volumes[cache] = {"bind": CACHE, "mode": "rw"}
    environment = {"MODEL_ID": "/models/tiny", "DOUBLE_RECORD_DIR": "/records", **(env or {})}
    return containers(image, environment=environment, volumes=volumes, healthcheck=FAST_HEALTHCHECK, **kwargs)


@pytest.fixture(scope="module")
def server(built):
    return built(NEW_TAG).image("server")


def test_serve_builds_the_engine_once_and_reuses_it(server, tiny_model, records, cache_volume, containers):
    settings = {"MAX_BATCH_SIZE": "8", "MAX_INPUT_LEN": "512", "MAX_SEQ_LEN": "1024"}
    first = serve(containers, server, tiny_model, records, cache=cache_volume, env=settings)
    wait_ready(first)
    assert wait_health_status(first) == "healthy", logs(first)

    [convert] = read_records(records, "convert_checkpoint")
    [build] = read_records(records, "trtllm-build")
    assert flags_of(convert)["model_dir"] == "/models/tiny"
    build_flags = flags_of(build)
    assert build_flags["checkpoint_dir"] == flags_of(convert)["output_dir"]
    assert build_flags["output_dir"].startswith(f"{CACHE}/engines/")
    assert {k: build_flags.get(k) for k in ("max_batch_size", "max_input_len", "max_seq_len", "kv_cache_type")} \
        == {"max_batch_size": "8", "max_input_len": "512", "max_seq_len": "1024", "kv_cache_type": "paged"}
    [triton] = read_records(records, "tritonserver")
    assert triton["pid"] == 1, "tritonserver must replace the entrypoint as the container's main process"
    assert {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing"} <= set(triton["models"])
    triton_flags = flags_of(triton)
    assert (triton_flags["http-port"], triton_flags["grpc-port"], triton_flags["metrics-port"]) \
        == ("8000", "8001", "8002")

    second = serve(containers, server, tiny_model, records, cache=cache_volume, env=settings)
    wait_ready(second)
    assert len(read_records(records, "trtllm-build")) == 1, "the second replica rebuilt a cached engine"
    assert len(read_records(records, "tritonserver")) == 2


def test_docker_stop_exits_zero_within_the_grace_period(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records)
    wait_ready(container)
    started = time.monotonic()
    container.stop(timeout=20)
    assert container.wait(timeout=30)["StatusCode"] == 0, logs(container)
    assert time.monotonic() - started < 20


def test_arbitrary_uid_can_build_and_serve(server, tiny_model, records, cache_volume, containers):
    container = serve(containers, server, tiny_model, records, cache=cache_volume, user="12345:0")
    wait_ready(container)
    [build] = read_records(records, "trtllm-build")
    assert (build["uid"], build["gid"]) == (12345, 0)


def test_read_only_root_file_system_with_tmpfs(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, read_only=True, tmpfs={"/tmp": "rw,exec"})
    wait_ready(container)
    [build] = read_records(records, "trtllm-build")
    assert flags_of(build)["output_dir"].startswith("/tmp/"), "the cache must fall back to the writable /tmp"
    assert "/tmp/trtllm-cache" in logs(container), "the fallback must be announced"


def test_kserve_stock_args_serve_a_read_only_prebuilt_engine(server, prebuilt_engine, records, containers):
    before = sorted((p.name, p.stat().st_mtime_ns) for p in prebuilt_engine.iterdir())
    container = containers(server, command=STOCK_KSERVE_ARGS, healthcheck=FAST_HEALTHCHECK,
                           environment={"DOUBLE_RECORD_DIR": "/records"},
                           volumes={str(prebuilt_engine): {"bind": "/mnt/models", "mode": "ro"},
                                    **record_mount(records)})
    wait_ready(container, port=8080)
    assert wait_health_status(container) == "healthy", logs(container)
    assert read_records(records, "trtllm-build") == [], "a prebuilt engine must be served as it is"
    [triton] = read_records(records, "tritonserver")
    flags = flags_of(triton)
    assert flags["model-store"] != "/mnt/models", "the filled repository must live outside /mnt/models"
    assert (flags["http-port"], flags["grpc-port"]) == ("8080", "9000")
    assert "tensorrt_llm" in triton["models"]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in prebuilt_engine.iterdir()) == before


def test_bad_environment_value_exits_2_before_any_work(server, tiny_model, records, containers):
    container = serve(containers, server, tiny_model, records, env={"TP_SIZE": "zero"})
    assert container.wait(timeout=60)["StatusCode"] == 2
    output = logs(container)
    assert "TP_SIZE" in output and "zero" in output
    assert read_records(records, "trtllm-build") == [] and read_records(records, "tritonserver") == []


def test_token_never_reaches_images_logs_or_cache(docker_client, built, server, tiny_model, records, cache_volume,
                                                  containers):
    build = built(NEW_TAG)
    for kind in ("server", "builder"):
        ref = build.image(kind)
        assert E2E_TOKEN not in json.dumps(docker_client.api.inspect_image(ref))
        assert E2E_TOKEN not in json.dumps(docker_client.api.history(ref))
    container = serve(containers, server, tiny_model, records, cache=cache_volume, env={"HF_TOKEN": E2E_TOKEN})
    wait_ready(container)
    assert read_records(records, "trtllm-build")[0]["env"]["HF_TOKEN_SET"] is True
    assert E2E_TOKEN not in logs(container)
    scan = containers(server, entrypoint=["grep", "-rl", E2E_TOKEN, CACHE], volumes={cache_volume: {"bind": CACHE}})
    assert scan.wait(timeout=60)["StatusCode"] == 1, f"token found in the cache: {logs(scan)}"


def test_old_tag_builds_with_bundled_backend_assets_and_serves(docker_client, built, tiny_model, records,
                                                               containers):
    build = built(OLD_TAG)
    server = build.image("server")
    probe = json.loads(docker_client.containers.run(server, command=["probe"], remove=True))
    assert probe["app_dir"] == "/opt/trtllm-images/app" and probe["templates"]["inflight_batcher_llm"]
    container = serve(containers, server, tiny_model, records)
    wait_ready(container)
    [build_call] = read_records(records, "trtllm-build")
    assert "max_seq_len" in flags_of(build_call) and "max_output_len" not in flags_of(build_call)
    assert read_records(records, "tritonserver")[0]["env"]["MATRIX_TAG"] == OLD_TAG


def test_verification_rejects_a_different_tensorrt_llm(docker_client, standin, session_dir):
    installed = "0.16.0"
    base = standin(NEW_TAG, tensorrt_llm=installed, image=f"trtllm-standin:{NEW_TAG}-mismatch")
    work = session_dir / "mismatch"
    work.mkdir()
    matrix = matrix_for_standin(work / "matrix.yaml", NEW_TAG, base.python)
    # A registry prefix keeps these refs apart from the good images the other tests use.
    result = run_build(NEW_TAG, base.image, matrix, work / "out", registry="e2e-mismatch.invalid")
    try:
        assert result.returncode != 0
        assert f"tensorrt_llm: expected 0.17.0, found {installed}" in result.output
    finally:
        for image in docker_client.images.list(name="e2e-mismatch.invalid/*"):
            for tag in image.tags:
                docker_client.images.remove(tag, force=True)
