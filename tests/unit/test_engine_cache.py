"""Engine cache: keys, stamps, validation of published entries, the lock protocol across real processes."""

from __future__ import annotations

import dataclasses
import fcntl
import io
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.image_data import ENGINE_DEFAULTS
from tests import factories
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.engine.cache import (
    EngineCache,
    cache_key,
    key_inputs,
    stamp_inputs,
)
from trtllm_entrypoint.engine.config import check_engine_version, read, serving_settings
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.log import Log

KEY = "0123456789abcdef0123"
TOKEN = "hf_NotARealTokenButSecret"
SETTINGS = dict(
    model_id="org/model",
    model_revision=None,
    hf_token=TOKEN,
    cache_dir=Path("/var/cache/trtllm"),
    engine_dir=None,
    templates_dir=Path("/app/all_models"),
    repository_dir=None,
    workflow="engine",
    **ENGINE_DEFAULTS,
    kv_cache_free_gpu_mem_fraction=0.9,
    decoupled=False,
    http_port=8000,
    grpc_port=8001,
    metrics_port=8002,
    openai_port=9000,
    frontend="triton",
    served_model_name=None,
    log_format="text",
    triton_args=(),
    exit_timeout_secs=30,
    lock_timeout_secs=3600,
)
FACTS = factories.image_facts(
    tag="25.01",
    tensorrt_llm="0.17.0",
    tensorrt="10.8.0.43",
    triton="2.54.0",
    workflows=("engine",),
    engine_deprecated=False,
    openai_frontend=True,
    app_dir=Path("/app"),
)
IDENTITY = {"repo_id": "org/model", "revision": "a" * 40}


def settings(**overrides):
    return SimpleNamespace(**{**SETTINGS, **overrides})


def gpus(cc="9.0", count=1, names=("NVIDIA H200",)):
    return SimpleNamespace(compute_capability=cc, count=count, names=names)


def quiet_log():
    return Log(stream=io.StringIO())


def write_engine(out_dir: Path, world_size: int = 1, version: str = "0.17.0") -> None:
    config = {"version": version, "pretrained_config": {"mapping": {"world_size": world_size}}, "build_config": {}}
    (out_dir / "config.json").write_text(json.dumps(config))
    for rank in range(world_size):
        (out_dir / f"rank{rank}.engine").write_bytes(b"engine-bytes-%d" % rank)


def engine_build(out_dir: Path, log_path: Path) -> None:
    with open(log_path, "a") as out:
        out.write("building\n")
    write_engine(out_dir)


# --- keys -------------------------------------------------------------------------------------------------------


def test_cache_key_is_short_hex_and_independent_of_key_order():
    key = cache_key({"a": 1, "b": [1, 2]})
    assert len(key) == 20 and all(c in "0123456789abcdef" for c in key)
    assert key == cache_key({"b": [1, 2], "a": 1})
    assert key != cache_key({"a": 1, "b": [2, 1]})


BASE_KEY = cache_key(key_inputs(IDENTITY, settings(), FACTS, gpus()))


@pytest.mark.parametrize(
    "field,value",
    [
        ("dtype", "bfloat16"),
        ("quantization", "fp8"),
        ("max_batch_size", 8),
        ("max_input_len", 1024),
        ("max_seq_len", 8192),
        ("max_num_tokens", 4096),
        ("max_beam_width", 4),
        ("tp_size", 2),
        ("pp_size", 2),
        ("enable_kv_cache_reuse", True),
    ],
)
def test_every_build_setting_changes_the_key(field, value):
    assert cache_key(key_inputs(IDENTITY, settings(**{field: value}), FACTS, gpus())) != BASE_KEY


@pytest.mark.parametrize(
    "field,value",
    [
        ("decoupled", True),
        ("http_port", 8080),
        ("grpc_port", 9000),
        ("metrics_port", 9090),
        ("openai_port", 9100),
        ("kv_cache_free_gpu_mem_fraction", 0.5),
        ("frontend", "openai"),
        ("served_model_name", "m"),
        ("log_format", "json"),
        ("triton_args", ("--log-verbose=1",)),
        ("exit_timeout_secs", 5),
        ("lock_timeout_secs", 10),
        ("hf_token", "hf_other"),
        ("cache_dir", Path("/elsewhere")),
        ("repository_dir", Path("/repo")),
        ("model_revision", "main"),
        ("workflow", "llmapi"),
    ],
)
def test_runtime_settings_do_not_change_the_key(field, value):
    assert cache_key(key_inputs(IDENTITY, settings(**{field: value}), FACTS, gpus())) == BASE_KEY


@pytest.mark.parametrize(
    "identity,facts,gpu_info,same",
    [
        ({**IDENTITY, "revision": "b" * 40}, FACTS, gpus(), False),
        ({"path": "/models/x", "fingerprint": "f" * 64}, FACTS, gpus(), False),
        (IDENTITY, dataclasses.replace(FACTS, tensorrt_llm="0.17.0.post1"), gpus(), False),
        (IDENTITY, dataclasses.replace(FACTS, tensorrt="10.8.0.44"), gpus(), False),
        (IDENTITY, FACTS, gpus(cc="8.9", names=("NVIDIA L40S",)), False),
        (IDENTITY, FACTS, gpus(count=8, names=("NVIDIA H100 80GB HBM3",) * 8), True),
        (IDENTITY, dataclasses.replace(FACTS, tag="25.02"), gpus(), True),
    ],
)
def test_model_versions_and_compute_capability_change_the_key(identity, facts, gpu_info, same):
    assert (cache_key(key_inputs(identity, settings(), facts, gpu_info)) == BASE_KEY) is same


def test_key_and_stamp_inputs_never_hold_the_token():
    inputs = key_inputs(IDENTITY, settings(), FACTS, gpus())
    stamped = stamp_inputs(inputs, FACTS, gpus(count=2, names=("A", "B")))
    assert TOKEN not in json.dumps(inputs) + json.dumps(stamped)
    assert stamped["gpus"] == {"count": 2, "names": ["A", "B"]} and stamped["image_tag"] == "25.01"
    assert inputs["schema"] >= 1 and {k: stamped[k] for k in inputs} == inputs


# --- engine config.json -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config,expected",
    [
        ({"pretrained_config": {"mapping": {"world_size": 4, "tp_size": 4}}}, 4),
        ({"pretrained_config": {"mapping": {"tp_size": 2, "pp_size": 2}}}, 4),
        ({"pretrained_config": {"mapping": {}}}, 1),
        ({"version": "0.17.0"}, 1),
    ],
)
def test_engine_world_size(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert read(tmp_path).world_size == expected


def test_engine_world_size_rejects_malformed_mapping_and_missing_config(tmp_path):
    with pytest.raises(EntrypointError, match="config.json does not exist"):
        read(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": {"world_size": "many"}}}))
    with pytest.raises(UsageError, match="expected pretrained_config.mapping to give a world size"):
        assert read(tmp_path).world_size


def test_check_engine_version_accepts_the_installed_version(tmp_path):
    write_engine(tmp_path, version="0.17.0")
    assert check_engine_version(read(tmp_path), "0.17.0") is None


@pytest.mark.parametrize(
    "built_with,installed,expected",
    [
        (None, "0.17.0", "has no version in config.json"),
        ("0.16.0", "0.17.0", "built with TensorRT-LLM 0.16.0, this image has 0.17.0"),
        ("0.17.0", "0.17.0.post1", "built with TensorRT-LLM 0.17.0, this image has 0.17.0.post1 (same release"),
    ],
)
def test_check_engine_version_names_both_versions_and_how_to_fix(tmp_path, built_with, installed, expected):
    config = {"pretrained_config": {}} if built_with is None else {"version": built_with}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EntrypointError) as caught:
        check_engine_version(read(tmp_path), installed)
    assert expected in caught.value.message
    assert "builder image" in caught.value.hint and "MODEL_ID" in caught.value.hint
    if built_with == "0.16.0":
        assert "same release" not in caught.value.message


def from_env(tmp_path, **env):
    return Settings.from_env({"CACHE_DIR": str(tmp_path / "cache"), **env}, FACTS)


def engine_with_build_config(path: Path, build_config: dict) -> Path:
    (path / "config.json").write_text(json.dumps({"version": "0.17.0", "build_config": build_config}))
    return path


def test_built_limits_come_from_build_config_and_old_engines_sum_input_and_output(tmp_path):
    new = engine_with_build_config(
        tmp_path,
        {
            "max_batch_size": 8,
            "max_input_len": 512,
            "max_seq_len": 1024,
            "max_beam_width": 2,
            "max_num_tokens": 2048,
            "strongly_typed": True,
        },
    )
    assert read(new).limits == {
        "max_batch_size": 8,
        "max_input_len": 512,
        "max_seq_len": 1024,
        "max_beam_width": 2,
        "max_num_tokens": 2048,
    }
    old = engine_with_build_config(tmp_path, {"max_batch_size": 4, "max_input_len": 100, "max_output_len": 50})
    assert read(old).limits == {"max_batch_size": 4, "max_input_len": 100, "max_seq_len": 150}


def test_a_prebuilt_engine_s_limits_replace_defaults_but_not_values_the_user_set(tmp_path):
    engine = engine_with_build_config(
        tmp_path, {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024, "max_num_tokens": 1024}
    )
    served, taken = serving_settings(from_env(tmp_path), read(engine))
    assert (served.max_batch_size, served.max_input_len, served.max_seq_len, served.max_num_tokens) == (
        8,
        512,
        1024,
        1024,
    )
    assert taken == {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024, "max_num_tokens": 1024}
    mine, taken = serving_settings(from_env(tmp_path, MAX_BATCH_SIZE="4"), read(engine))
    assert mine.max_batch_size == 4 and "max_batch_size" not in taken


def test_a_prebuilt_engine_s_parallelism_must_match_a_value_the_user_set(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"version": "0.17.0", "build_config": {}, "pretrained_config": {"mapping": {"tp_size": 2, "pp_size": 1}}}
        )
    )
    served, taken = serving_settings(from_env(tmp_path), read(tmp_path))
    assert (served.tp_size, served.pp_size, served.world_size) == (2, 1, 2) and taken == {"tp_size": 2}
    assert serving_settings(from_env(tmp_path, TP_SIZE="2"), read(tmp_path))[0].tp_size == 2
    with pytest.raises(UsageError, match=r"^TP_SIZE=4 is not allowed: expected 2, what the engine in"):
        serving_settings(from_env(tmp_path, TP_SIZE="4"), read(tmp_path))


def test_a_value_the_engine_cannot_honour_is_refused(tmp_path):
    engine = engine_with_build_config(tmp_path, {"max_batch_size": 8})
    with pytest.raises(UsageError) as info:
        serving_settings(from_env(tmp_path, MAX_BATCH_SIZE="64"), read(engine))
    assert info.value.message.startswith("MAX_BATCH_SIZE=64 is not allowed: expected at most 8")
    assert "unset MAX_BATCH_SIZE" in info.value.hint


# --- publish and lookup -----------------------------------------------------------------------------------------


def test_ensure_builds_once_then_hits_and_writes_a_complete_stamp(tmp_path):
    cache = EngineCache(tmp_path / "engines")
    inputs = stamp_inputs(key_inputs(IDENTITY, settings(), FACTS, gpus()), FACTS, gpus())
    path, built = cache.ensure(KEY, inputs, engine_build, timeout_s=5, log=quiet_log())
    assert built and path == tmp_path / "engines" / KEY
    assert sorted(p.name for p in path.iterdir()) == ["build.log", "config.json", "rank0.engine", "stamp.json"]
    assert (path / "build.log").read_text() == "building\n"
    assert not (tmp_path / "engines" / f"{KEY}.build.log").exists()
    stamp = json.loads((path / "stamp.json").read_text())
    assert stamp["key"] == KEY and stamp["inputs"] == json.loads(json.dumps(inputs))
    assert stamp["builder"]["pid"] == os.getpid() and set(stamp["durations"]) == {"lock_wait_s", "build_s"}
    assert stamp["created"].endswith("Z") and stamp["files"]["rank0.engine"]["size"] == len(b"engine-bytes-0")
    assert TOKEN not in (path / "stamp.json").read_text()

    def must_not_build(out_dir, log_path):
        raise AssertionError("cache hit expected")

    assert cache.ensure(KEY, inputs, must_not_build, timeout_s=5, log=quiet_log()) == (path, False)
    assert not list((tmp_path / "engines").glob(f".{KEY}.new-*"))


def _drop(name):
    return lambda entry: (entry / name).unlink()


def _second_rank_missing(entry):
    write_engine(entry, world_size=2)
    (entry / "rank1.engine").unlink()


def _truncate_engine(entry):
    (entry / "rank0.engine").write_bytes(b"short")


def _edit_config(entry):
    config = json.loads((entry / "config.json").read_text())
    (entry / "config.json").write_text(json.dumps({**config, "version": "0.17.1"}))


def _stamp_without_files(entry):
    stamp = json.loads((entry / "stamp.json").read_text())
    (entry / "stamp.json").write_text(json.dumps({**stamp, "files": []}))


def _foreign_stamp(entry):
    (entry / "stamp.json").write_text(json.dumps({"key": "f" * 20}))


def _garbled_stamp(entry):
    (entry / "stamp.json").write_text("{not json")


@pytest.mark.parametrize(
    "damage,reason",
    [
        (_drop("stamp.json"), "stamp.json is missing"),
        (_garbled_stamp, "stamp.json is unreadable"),
        (_foreign_stamp, f"does not belong to key {KEY}"),
        (_drop("config.json"), "config.json does not exist"),
        (_second_rank_missing, "missing rank1.engine"),
        (_truncate_engine, "rank0.engine is missing or does not have the size"),
        (_edit_config, "config.json differs from the content recorded"),
        (_stamp_without_files, "stamp.json records no files"),
    ],
)
def test_lookup_treats_incomplete_entries_as_absent_and_says_why(tmp_path, damage, reason):
    cache = EngineCache(tmp_path)
    entry, _ = cache.ensure(KEY, {}, engine_build, timeout_s=5, log=quiet_log())
    damage(entry)
    stream = io.StringIO()
    assert cache.lookup(KEY, Log(stream=stream)) is None
    assert "ignoring invalid engine cache entry" in stream.getvalue() and reason in stream.getvalue()


def test_a_failing_build_leaves_no_temp_dir_and_no_entry_but_keeps_its_log(tmp_path):
    cache = EngineCache(tmp_path)

    def failing(out_dir, log_path):
        (out_dir / "rank0.engine").write_bytes(b"half")
        log_path.write_text("trtllm-build: out of memory\n")
        raise EntrypointError("trtllm-build exited with code 1")

    with pytest.raises(EntrypointError, match="exited with code 1"):
        cache.ensure(KEY, {}, failing, timeout_s=5, log=quiet_log())
    kept = f"{KEY}.failed-{os.getpid()}.log"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{KEY}.lock", kept]
    assert "out of memory" in (tmp_path / kept).read_text()
    assert cache.lookup(KEY) is None


def test_the_error_of_a_failed_build_points_at_the_kept_log(tmp_path):
    cache = EngineCache(tmp_path)

    def failing(out_dir, log_path):
        log_path.write_text("boom\n")
        raise UsageError("step failed", "see the build log")

    with pytest.raises(UsageError) as caught:
        cache.ensure(KEY, {}, failing, timeout_s=5, log=quiet_log())
    kept = tmp_path / f"{KEY}.failed-{os.getpid()}.log"
    assert caught.value.message == "step failed", "the builder's message is kept as it said it"
    assert caught.value.hint == f"the full output is in {kept}"
    assert kept.read_text() == "boom\n"


def test_an_invalid_published_dir_is_rebuilt_and_not_kept_as_a_copy(tmp_path):
    foreign = tmp_path / KEY
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")  # e.g. half of an rsync: no stamp, no engines
    stream = io.StringIO()
    path, built = EngineCache(tmp_path).ensure(KEY, {}, engine_build, timeout_s=5, log=Log(stream=stream))
    assert built and (path / "stamp.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{KEY}.lock", KEY]
    assert "removing a copy published earlier" in stream.getvalue() and "stamp.json is missing" in stream.getvalue()


def test_lock_timeout_names_the_lock_and_its_holder(tmp_path):
    cache = EngineCache(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    holder = os.open(tmp_path / f".{KEY}.lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(holder, json.dumps({"pid": 4242, "host": "builder-0", "since": "2025-01-01T00:00:00Z"}).encode())
        fcntl.flock(holder, fcntl.LOCK_EX)  # a second open file description conflicts even within one process
        stream = io.StringIO()
        with pytest.raises(EntrypointError) as caught:
            cache.ensure(KEY, {}, engine_build, timeout_s=0.5, log=Log(stream=stream))
    finally:
        os.close(holder)
    assert f".{KEY}.lock" in caught.value.message and "pid 4242 on builder-0" in caught.value.message
    assert "LOCK_TIMEOUT_SECS" in caught.value.hint
    assert stream.getvalue().count(f"waiting for another process building {KEY}") == 1
    assert not (tmp_path / KEY).exists()


def test_waiting_for_another_build_logs_a_heartbeat_naming_the_holder_and_its_build_log(tmp_path):
    cache = EngineCache(tmp_path)
    holder = os.open(tmp_path / f".{KEY}.lock", os.O_RDWR | os.O_CREAT)
    building = tmp_path / f".{KEY}.new-abc123"
    building.mkdir()
    (building / "build.log").write_text("$ trtllm-build ...\n")
    try:
        os.write(holder, json.dumps({"pid": 4242, "host": "builder-0", "since": "2025-01-01T00:00:00Z"}).encode())
        fcntl.flock(holder, fcntl.LOCK_EX)
        stream = io.StringIO()
        with pytest.raises(EntrypointError):
            cache.ensure(KEY, {}, engine_build, timeout_s=0.9, log=Log(stream=stream, progress_s=0.2))
    finally:
        os.close(holder)
    beats = [line for line in stream.getvalue().splitlines() if "still waiting for another process building" in line]
    assert len(beats) >= 2, stream.getvalue()
    assert all("pid 4242 on builder-0" in line and f"output={building / 'build.log'}" in line for line in beats)
    assert all("elapsed_s=" in line for line in beats)


# --- several processes ------------------------------------------------------------------------------------------


def _ensure_in_child(root: str, counter: str, start, results) -> None:
    def counted_build(out_dir, log_path):
        with open(counter, "a") as out:
            out.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # keep the lock long enough that the others really wait for it
        write_engine(out_dir)

    start.wait(30)
    path, built = EngineCache(Path(root)).ensure(KEY, {}, counted_build, timeout_s=120, log=quiet_log())
    results.put((str(path), built))


def test_concurrent_processes_build_exactly_once_and_share_the_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    counter = tmp_path / "builds.txt"
    procs = [
        ctx.Process(target=_ensure_in_child, args=(str(tmp_path / "engines"), str(counter), start, results))
        for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    start.set()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert len(counter.read_text().splitlines()) == 1
    assert {path for path, _ in outcomes} == {str(tmp_path / "engines" / KEY)}
    assert sorted(built for _, built in outcomes) == [False, False, False, True]


def _build_until_killed(root: str, marker: str) -> None:
    def hanging_build(out_dir, log_path):
        (out_dir / "rank0.engine").write_bytes(b"partial")
        Path(marker).write_text(str(os.getpid()))
        time.sleep(600)

    EngineCache(Path(root)).ensure(KEY, {}, hanging_build, timeout_s=5, log=quiet_log())


def test_a_killed_builder_leaves_no_entry_and_the_next_start_rebuilds_and_cleans_up(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    marker = tmp_path / "started"
    root = tmp_path / "engines"
    proc = ctx.Process(target=_build_until_killed, args=(str(root), str(marker)))
    proc.start()
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the child never started building"

    with pytest.raises(EntrypointError, match=f"held by pid {proc.pid} on "):
        EngineCache(root).ensure(KEY, {}, engine_build, timeout_s=0.3, log=quiet_log())

    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    assert not (root / KEY).exists() and len(list(root.glob(f".{KEY}.new-*"))) == 1

    stream = io.StringIO()
    path, built = EngineCache(root).ensure(KEY, {}, engine_build, timeout_s=5, log=Log(stream=stream))
    assert built and (path / "rank0.engine").read_bytes() == b"engine-bytes-0"
    assert not list(root.glob(f".{KEY}.new-*"))
    assert "removing the leftovers of an interrupted run" in stream.getvalue()
