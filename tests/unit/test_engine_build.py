"""Engine build: model families, the exact convert/quantize/trtllm-build argv per TensorRT-LLM version, the runner."""

from __future__ import annotations

import dataclasses
import io
import os
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.doubles.double_records import read_records
from tests.doubles.install import double_environ, install_doubles
from trtllm_entrypoint.engine_build import (
    Command, build_commands, build_notes, engine_builder, model_family, resolve_script, run_commands,
)
from trtllm_entrypoint.engine_cache import EngineCache
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.facts import ImageFacts
from trtllm_entrypoint.log import Log

APP, MODEL, OUT, WORK = Path("/app"), Path("/m"), Path("/o"), Path("/o/checkpoint")
DEFAULTS = dict(dtype="auto", quantization="none", max_batch_size=64, max_input_len=2048, max_seq_len=4096,
                max_num_tokens=8192, max_beam_width=1, tp_size=1, pp_size=1, enable_kv_cache_reuse=False)


def settings(**overrides):
    return SimpleNamespace(**{**DEFAULTS, **overrides})


def facts(version: str, app_dir: Path = APP) -> ImageFacts:
    return ImageFacts(tag="test", tensorrt_llm=version, tensorrt="10.0.0", triton=None, workflows=("engine",),
                      engine_deprecated=False, openai_frontend=False, app_dir=app_dir)


# --- families ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config,family", [
    ({"model_type": "llama"}, "llama"),
    ({"model_type": "mistral"}, "llama"),
    ({"model_type": "mixtral"}, "llama"),
    ({"model_type": "qwen2"}, "qwen"),
    ({"model_type": "gemma2"}, "gemma"),
    ({"model_type": "phi3"}, "phi"),
    ({"model_type": "gpt2"}, "gpt"),
    ({"model_type": "gpt_bigcode"}, "gpt"),
    ({"model_type": "gpt_neox"}, "gptneox"),
    ({"model_type": "RefinedWebModel"}, "falcon"),
    ({"architectures": ["LlamaForCausalLM"]}, "llama"),
    ({"architectures": ["GPTNeoXForCausalLM"]}, "gptneox"),
    ({"architectures": ["QWenLMHeadModel"]}, "qwen"),
    ({"model_type": "custom", "architectures": ["MistralForCausalLM"]}, "llama"),
])
def test_model_family(config, family):
    assert model_family(config) == family


def test_unknown_model_family_lists_the_supported_ones():
    with pytest.raises(UsageError) as caught:
        model_family({"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    assert "'mamba'" in caught.value.message and "MambaForCausalLM" in caught.value.message
    assert "llama" in caught.value.hint and "qwen2" in caught.value.hint and "ENGINE_DIR" in caught.value.hint


# --- argv per version -------------------------------------------------------------------------------------------

def convert(script: str, dtype: str) -> list[str]:
    return ["python3", f"/app/examples/{script}", "--model_dir", "/m", "--output_dir", "/o/checkpoint",
            "--dtype", dtype, "--tp_size", "1", "--pp_size", "1"]


OLD = convert("llama/convert_checkpoint.py", "float16")
NEW = convert("models/core/llama/convert_checkpoint.py", "auto")
HEAD = ["trtllm-build", "--checkpoint_dir", "/o/checkpoint", "--output_dir", "/o"]
LIMITS = ["--max_batch_size", "64", "--max_input_len", "2048"]
TAIL = ["--max_num_tokens", "8192", "--max_beam_width", "1"]


@pytest.mark.parametrize("version,convert_argv,build_argv", [
    ("0.9.0", OLD, HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_output_len", "2048", *TAIL,
                           "--paged_kv_cache", "enable"]),
    ("0.10.0", OLD, HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_output_len", "2048", *TAIL,
                            "--paged_kv_cache", "enable"]),
    ("0.11.0", OLD, HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_seq_len", "4096", *TAIL,
                            "--paged_kv_cache", "enable"]),
    ("0.12.0", OLD, HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_seq_len", "4096", *TAIL,
                            "--kv_cache_type", "paged"]),
    ("0.13.0", OLD, HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_seq_len", "4096", *TAIL,
                            "--kv_cache_type", "paged"]),
    ("0.17.0", convert("llama/convert_checkpoint.py", "auto"),
     HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", "4096", *TAIL, "--kv_cache_type", "paged"]),
    ("0.20.0", NEW, HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", "4096", *TAIL,
                            "--kv_cache_type", "paged"]),
    ("1.0.0", NEW, HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", "4096", *TAIL,
                           "--kv_cache_type", "paged"]),
    ("1.2.1", NEW, HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", "4096", *TAIL,
                           "--kv_cache_type", "paged"]),
])
def test_default_build_commands_per_version(version, convert_argv, build_argv):
    commands = build_commands(facts(version), settings(), MODEL, OUT, WORK, "llama")
    assert commands == [Command(tuple(convert_argv), "convert"), Command(tuple(build_argv), "trtllm-build")]


PARALLEL_QUANTIZED = dict(dtype="bfloat16", quantization="int4_awq", tp_size=2, pp_size=2, enable_kv_cache_reuse=True,
                          max_batch_size=8, max_input_len=1000, max_seq_len=3000, max_num_tokens=4000,
                          max_beam_width=2)


@pytest.mark.parametrize("version,length,paged", [
    ("0.10.0", ["--max_output_len", "2000"], ["--paged_kv_cache", "enable"]),
    ("0.12.0", ["--max_seq_len", "3000"], ["--kv_cache_type", "paged"]),
    ("1.2.1", ["--max_seq_len", "3000"], ["--kv_cache_type", "paged"]),
])
def test_quantized_parallel_build_commands(version, length, paged):
    quantize, build = build_commands(facts(version), settings(**PARALLEL_QUANTIZED), MODEL, OUT, WORK, "llama")
    assert quantize == Command(("python3", "/app/examples/quantization/quantize.py", "--model_dir", "/m",
                                "--output_dir", "/o/checkpoint", "--dtype", "bfloat16", "--tp_size", "2",
                                "--pp_size", "2", "--qformat", "int4_awq"), "quantize")
    assert build == Command((*HEAD, "--gemm_plugin", "bfloat16", "--max_batch_size", "8", "--max_input_len", "1000",
                             *length, "--max_num_tokens", "4000", "--max_beam_width", "2", *paged,
                             "--use_paged_context_fmha", "enable", "--workers", "4"), "trtllm-build")


@pytest.mark.parametrize("version,family,script", [
    ("0.19.0", "falcon", "/app/examples/falcon/convert_checkpoint.py"),
    ("0.20.0", "falcon", "/app/examples/models/contrib/falcon/convert_checkpoint.py"),
    ("0.20.0", "qwen", "/app/examples/models/core/qwen/convert_checkpoint.py"),
    ("1.0.0", "gptneox", "/app/examples/models/contrib/gptneox/convert_checkpoint.py"),
])
def test_convert_script_location_by_version_and_family(version, family, script):
    assert build_commands(facts(version), settings(), MODEL, OUT, WORK, family)[0].argv[1] == script


def test_versions_before_the_unified_workflow_are_refused():
    with pytest.raises(UsageError, match="needs TensorRT-LLM 0.9 or newer; this image has 0.8.0") as caught:
        build_commands(facts("0.8.0"), settings(), MODEL, OUT, WORK, "llama")
    assert "ENGINE_DIR" in caught.value.hint


@pytest.mark.parametrize("version,dtype,expected", [
    ("0.10.0", "auto", ["DTYPE=auto converts as float16", "--max_output_len 2048"]),
    ("0.13.0", "auto", ["DTYPE=auto converts as float16"]),
    ("0.13.0", "bfloat16", []),
    ("0.17.0", "auto", []),
])
def test_build_notes_say_what_differs_from_the_settings(version, dtype, expected):
    notes = build_notes(facts(version), settings(dtype=dtype))
    assert len(notes) == len(expected) and all(want in note for want, note in zip(expected, notes))


# --- running ----------------------------------------------------------------------------------------------------

def py(code: str, name: str = "step") -> Command:
    return Command((sys.executable, "-c", code), name)


def test_run_commands_appends_redacted_output_and_logs_each_step(tmp_path):
    log_path, stream = tmp_path / "build.log", io.StringIO()
    run_commands([py("print('converting with s3cr3t')", "convert"),
                  py("import sys; print('building', file=sys.stderr)", "trtllm-build")],
                 log_path, Log(stream=stream, secrets=("s3cr3t",)), {})
    text = log_path.read_text()
    assert "converting with ***" in text and "building" in text and "s3cr3t" not in text
    assert text.count("$ ") == 2
    assert "step=convert" in stream.getvalue() and "step done step=trtllm-build" in stream.getvalue()


def test_a_failing_command_stops_the_run_and_reports_its_tail(tmp_path):
    log_path, never = tmp_path / "build.log", tmp_path / "never"
    failing = py("import sys\nfor i in range(30): print(f'line {i}')\nsys.exit(3)", "convert")
    with pytest.raises(EntrypointError) as caught:
        run_commands([failing, py(f"open({str(never)!r}, 'w')")], log_path, Log(stream=io.StringIO()), {})
    message = caught.value.message
    assert message.startswith("convert exited with code 3 after ")
    assert "line 29" in message and "line 10" in message and "line 9\n" not in message
    assert str(log_path) in caught.value.hint and "line 0" in log_path.read_text()
    assert not never.exists()


def test_a_killed_command_and_a_missing_program_are_reported(tmp_path):
    killed = py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "trtllm-build")
    with pytest.raises(EntrypointError, match="trtllm-build was killed by signal 9"):
        run_commands([killed], tmp_path / "log", Log(stream=io.StringIO()), {})
    with pytest.raises(EntrypointError, match=r"cannot run trtllm-build \(/nonexistent/trtllm-build\)"):
        run_commands([Command(("/nonexistent/trtllm-build",), "trtllm-build")], tmp_path / "log",
                     Log(stream=io.StringIO()), {})


def test_resolve_script(tmp_path):
    script = tmp_path / "convert_checkpoint.py"
    with pytest.raises(EntrypointError) as caught:
        resolve_script(script, "0.20.0")
    assert str(script) in caught.value.message and "0.20.0" in caught.value.message
    assert "TRTLLM_APP_DIR" in caught.value.hint
    script.write_text("")
    assert resolve_script(script, "0.20.0") == script


# --- a whole build against the NVIDIA doubles --------------------------------------------------------------------

@pytest.fixture
def doubles(tmp_path):
    paths = install_doubles(tmp_path / "doubles", trtllm_version="0.17.0", tensorrt_version="10.8.0.43",
                            with_app=True, templates_src=None)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    records = tmp_path / "records"
    return SimpleNamespace(paths=paths, model=model, records=records, env=double_environ(paths, records),
                           facts=facts("0.17.0", paths["app"]), cache=EngineCache(tmp_path / "engines"))


def test_engine_builder_publishes_only_the_engine(doubles):
    chosen = settings(tp_size=2)
    build = engine_builder(doubles.facts, chosen, doubles.model, "llama", Log(stream=io.StringIO()), doubles.env)
    entry, built = doubles.cache.ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert built
    assert sorted(p.name for p in entry.iterdir()) == ["build.log", "config.json", "rank0.engine", "rank1.engine",
                                                      "stamp.json"]
    (convert_call,) = read_records(doubles.records, "convert_checkpoint")
    (build_call,) = read_records(doubles.records, "trtllm-build")
    # Built in the cache's temp dir (renamed to the entry afterwards), checkpoint inside it.
    tmp = Path(convert_call["argv"][convert_call["argv"].index("--output_dir") + 1]).parent
    assert tmp.parent == entry.parent and tmp.name.startswith("." + "k" * 20 + ".new-")
    convert, trtllm_build = build_commands(doubles.facts, chosen, doubles.model, tmp, tmp / "checkpoint", "llama")
    assert convert_call["argv"] == list(convert.argv[2:]) and build_call["argv"] == list(trtllm_build.argv[1:])
    assert "$ python3 " in (entry / "build.log").read_text()


def test_engine_builder_failure_publishes_nothing(doubles):
    env = {**doubles.env, "TRTLLM_BUILD_DOUBLE_FAIL": "1"}
    build = engine_builder(doubles.facts, settings(), doubles.model, "llama", Log(stream=io.StringIO()), env)
    with pytest.raises(EntrypointError, match="trtllm-build exited with code 1") as caught:
        doubles.cache.ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert "build failed" in caught.value.message, "the error carries the tail of the program's output"
    kept = doubles.cache.root / f"{'k' * 20}.failed-{os.getpid()}.log"
    assert sorted(p.name for p in doubles.cache.root.iterdir()) == ["." + "k" * 20 + ".lock", kept.name]
    assert str(kept) in caught.value.hint


def test_engine_builder_needs_the_convert_script_of_the_version(doubles):
    newer = dataclasses.replace(doubles.facts, tensorrt_llm="0.20.0")
    build = engine_builder(newer, settings(), doubles.model, "falcon", Log(stream=io.StringIO()), doubles.env)
    with pytest.raises(EntrypointError, match="models/contrib/falcon/convert_checkpoint.py does not exist"):
        doubles.cache.ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert read_records(doubles.records, "convert_checkpoint") == []
