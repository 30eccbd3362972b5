"""Engine build: model families, the exact convert/quantize/trtllm-build argv per TensorRT-LLM version, the runner."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.doubles import double_environ, install_doubles, read_records
from harness.image_data import ENGINE_DEFAULTS, image_facts, model_table
from trtllm_entrypoint.config.records import EngineSpec
from trtllm_entrypoint.engine.build import (
    Command,
    build_commands,
    build_notes,
    engine_builder,
    resolve_script,
    run_commands,
)
from trtllm_entrypoint.engine.cache import EngineCache
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.model import support as models

MODEL, OUT, WORK = Path("/m"), Path("/o"), Path("/o/checkpoint")
DEFAULTS = ENGINE_DEFAULTS


def settings(**overrides):
    """An EngineSpec alone, nothing else of the settings: the build commands must need no more."""
    return EngineSpec(**{**DEFAULTS, **overrides})


def converter(tag: str, model_type: str = "llama") -> models.Converter:
    return models.required(models.engine_converter(model_table(), {"model_type": model_type}, image_facts(tag)))


def commands(tag: str, model_type: str = "llama", **overrides) -> list[Command]:
    return build_commands(image_facts(tag), settings(**overrides), MODEL, OUT, WORK, converter(tag, model_type))


# --- converters from the model list -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tag,config,folder,args",
    [
        ("25.01", {"model_type": "mistral"}, "llama", ()),
        ("25.01", {"architectures": ["MixtralForCausalLM"]}, "llama", ()),
        ("24.06", {"model_type": "qwen2"}, "qwen", ("--qwen_type", "qwen2")),  # only 0.10.0 needs --qwen_type
        ("24.07", {"model_type": "qwen2"}, "qwen", ()),
        ("24.08", {"model_type": "starcoder2"}, "gpt", ("--gpt_variant", "starcoder2")),
        ("25.01", {"model_type": "starcoder2"}, "gpt", ()),
        ("24.08", {"model_type": "RefinedWebModel"}, "falcon", ()),
        ("25.06", {"model_type": "falcon"}, "models/contrib/falcon", ()),
        ("25.06", {"model_type": "phi3"}, "models/core/phi", ()),
        ("26.07", {"model_type": "custom", "architectures": ["GPTNeoXForCausalLM"]}, "models/contrib/gptneox", ()),
    ],
)
def test_converter_folder_and_arguments_come_from_the_model_list(tag, config, folder, args):
    assert models.engine_converter(model_table(), config, image_facts(tag)) == models.Converter(folder, args)


def test_a_model_newer_than_the_image_is_refused_naming_the_tags_that_serve_it():
    with pytest.raises(UsageError) as caught:
        models.required(
            models.engine_converter(
                model_table(), {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}, image_facts("24.05")
            )
        )
    assert caught.value.message == (
        "Phi3ForCausalLM (model_type phi3) needs TensorRT-LLM 0.10.0 or later for "
        "WORKFLOW=engine (tags 24.06 and later); this image (24.05) has TensorRT-LLM "
        "0.9.0"
    )
    assert "build.py models" in caught.value.hint


def test_the_other_workflow_of_the_image_is_named_when_it_serves_the_model():
    reason = models.unsupported_reason(
        model_table(), {"architectures": ["DeepseekV3ForCausalLM"]}, image_facts("25.05"), "engine"
    )
    assert reason.startswith("DeepseekV3ForCausalLM (model_type unset) has no TensorRT-LLM engine converter")
    assert reason.endswith("; this image serves it with WORKFLOW=llmapi")
    reason = models.unsupported_reason(model_table(), {"model_type": "qwen3"}, image_facts("25.05"), "llmapi")
    assert "needs TensorRT-LLM 0.20.0 or later for WORKFLOW=llmapi (tags 25.06 and later)" in reason
    assert "WORKFLOW=engine" not in reason  # 25.05 has no Qwen3 converter either


def test_an_unlisted_model_is_refused_for_engines_and_left_to_the_llm_api():
    config = {"model_type": "brand_new", "architectures": ["BrandNewForCausalLM"]}
    assert "no TensorRT-LLM engine converter in the model list of this image (25.06)" in models.unsupported_reason(
        model_table(), config, image_facts("25.06"), "engine"
    )
    assert models.unsupported_reason(model_table(), config, image_facts("25.06"), "llmapi") is None


# --- argv per image -----------------------------------------------------------------------------------------------


def convert(script: str, dtype: str) -> list[str]:
    return [
        "python3",
        f"/app/examples/{script}",
        "--model_dir",
        "/m",
        "--output_dir",
        "/o/checkpoint",
        "--dtype",
        dtype,
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]


OLD = convert("llama/convert_checkpoint.py", "float16")
NEW = convert("models/core/llama/convert_checkpoint.py", "auto")
HEAD = ["trtllm-build", "--checkpoint_dir", "/o/checkpoint", "--output_dir", "/o"]
LIMITS = ["--max_batch_size", str(DEFAULTS["max_batch_size"]), "--max_input_len", str(DEFAULTS["max_input_len"])]
TAIL = ["--max_num_tokens", str(DEFAULTS["max_num_tokens"]), "--max_beam_width", str(DEFAULTS["max_beam_width"])]
SEQ = str(DEFAULTS["max_seq_len"])
OUTPUT = str(DEFAULTS["max_seq_len"] - DEFAULTS["max_input_len"])  # before 0.11: the tokens after the input


@pytest.mark.parametrize(
    "tag,convert_argv,build_argv",
    [
        (
            "24.04",
            OLD,
            HEAD
            + ["--gemm_plugin", "float16", *LIMITS, "--max_output_len", OUTPUT, *TAIL, "--paged_kv_cache", "enable"],
        ),  # 0.9.0
        (
            "24.06",
            OLD,
            HEAD
            + ["--gemm_plugin", "float16", *LIMITS, "--max_output_len", OUTPUT, *TAIL, "--paged_kv_cache", "enable"],
        ),  # 0.10.0
        (
            "24.07",
            OLD,
            HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--paged_kv_cache", "enable"],
        ),  # 0.11.0
        (
            "24.08",
            OLD,
            HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--kv_cache_type", "paged"],
        ),  # 0.12.0
        (
            "24.09",
            OLD,
            HEAD + ["--gemm_plugin", "float16", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--kv_cache_type", "paged"],
        ),  # 0.13.0
        (
            "25.01",
            convert("llama/convert_checkpoint.py", "auto"),
            HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--kv_cache_type", "paged"],
        ),
        (
            "25.06",
            NEW,
            HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--kv_cache_type", "paged"],
        ),  # 0.20.0
        (
            "25.09",
            NEW,
            HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--kv_cache_type", "paged"],
        ),  # 1.0.0
        (
            "26.07",
            NEW,
            HEAD + ["--gemm_plugin", "auto", *LIMITS, "--max_seq_len", SEQ, *TAIL, "--kv_cache_type", "paged"],
        ),  # 1.2.1
    ],
)
def test_default_build_commands_per_image(tag, convert_argv, build_argv):
    assert commands(tag) == [Command(tuple(convert_argv), "convert"), Command(tuple(build_argv), "trtllm-build")]


def test_model_specific_converter_arguments_are_appended():
    (convert_command, _) = commands("24.06", "qwen2")
    assert convert_command.argv[-2:] == ("--qwen_type", "qwen2")
    assert convert_command.argv[1] == "/app/examples/qwen/convert_checkpoint.py"


PARALLEL_QUANTIZED = dict(
    dtype="bfloat16",
    quantization="int4_awq",
    tp_size=2,
    pp_size=2,
    enable_kv_cache_reuse=True,
    max_batch_size=8,
    max_input_len=1000,
    max_seq_len=3000,
    max_num_tokens=4000,
    max_beam_width=2,
)


@pytest.mark.parametrize(
    "tag,length,paged",
    [
        ("24.06", ["--max_output_len", "2000"], ["--paged_kv_cache", "enable"]),
        ("24.08", ["--max_seq_len", "3000"], ["--kv_cache_type", "paged"]),
        ("26.07", ["--max_seq_len", "3000"], ["--kv_cache_type", "paged"]),
    ],
)
def test_quantized_parallel_build_commands(tag, length, paged):
    quantize, build = commands(tag, "qwen2", **PARALLEL_QUANTIZED)
    assert quantize == Command(
        (
            "python3",
            "/app/examples/quantization/quantize.py",
            "--model_dir",
            "/m",
            "--output_dir",
            "/o/checkpoint",
            "--dtype",
            "bfloat16",
            "--tp_size",
            "2",
            "--pp_size",
            "2",
            "--qformat",
            "int4_awq",
        ),
        "quantize",
    )
    assert build == Command(
        (
            *HEAD,
            "--gemm_plugin",
            "bfloat16",
            "--max_batch_size",
            "8",
            "--max_input_len",
            "1000",
            *length,
            "--max_num_tokens",
            "4000",
            "--max_beam_width",
            "2",
            *paged,
            "--use_paged_context_fmha",
            "enable",
            "--workers",
            "4",
        ),
        "trtllm-build",
    )


def test_images_before_the_unified_workflow_are_refused():
    with pytest.raises(UsageError, match="needs TensorRT-LLM 0.9 or newer; this image has 0.8.0") as caught:
        build_commands(image_facts("24.02"), settings(), MODEL, OUT, WORK, models.Converter("llama", ()))
    assert "ENGINE_DIR" in caught.value.hint


@pytest.mark.parametrize(
    "tag,dtype,expected",
    [
        ("24.06", "auto", ["DTYPE=auto converts as float16", "--max_output_len 2048"]),
        ("24.09", "auto", ["DTYPE=auto converts as float16"]),
        ("24.09", "bfloat16", []),
        ("25.01", "auto", []),
    ],
)
def test_build_notes_say_what_differs_from_the_settings(tag, dtype, expected):
    notes = build_notes(image_facts(tag), settings(dtype=dtype))
    assert len(notes) == len(expected) and all(want in note for want, note in zip(expected, notes, strict=True))


# --- running ----------------------------------------------------------------------------------------------------


def py(code: str, name: str = "step") -> Command:
    return Command((sys.executable, "-c", code), name)


@pytest.mark.process
def test_run_commands_appends_redacted_output_and_logs_each_step(tmp_path):
    log_path, stream = tmp_path / "build.log", io.StringIO()
    run_commands(
        [
            py("print('converting with s3cr3t')", "convert"),
            py("import sys; print('building', file=sys.stderr)", "trtllm-build"),
        ],
        log_path,
        Log(stream=stream, secrets=("s3cr3t",)),
        {},
    )
    text = log_path.read_text()
    assert "converting with ***" in text and "building" in text and "s3cr3t" not in text
    assert text.count("$ ") == 2
    assert "step=convert" in stream.getvalue() and "step done step=trtllm-build" in stream.getvalue()


@pytest.mark.process
def test_a_long_step_logs_a_heartbeat_with_its_elapsed_time_and_output(tmp_path):
    log_path, stream = tmp_path / "build.log", io.StringIO()
    slow = py("import time\nfor i in range(4):\n    print(i, flush=True); time.sleep(0.3)", "trtllm-build")
    run_commands([slow], log_path, Log(stream=stream, progress_s=0.25), {})
    lines = stream.getvalue().splitlines()
    beats = [line for line in lines if "still running" in line]
    assert len(beats) >= 3, lines
    assert all(f"step=trtllm-build output={log_path} elapsed_s=" in line for line in beats)
    assert lines[-1].startswith("[trtllm-entrypoint] info: step done step=trtllm-build"), "no beat after the step"
    # The routine log names the step and its output file; the full command line is for LOG_LEVEL=debug.
    assert f"running step=trtllm-build output={log_path}" in lines[0] and "-c" not in lines[0]


@pytest.mark.process
def test_a_json_heartbeat_is_one_object_per_line(tmp_path):
    stream = io.StringIO()
    run_commands(
        [py("import time; time.sleep(0.5)", "convert")], tmp_path / "log", Log("json", stream, progress_s=0.2), {}
    )
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    beats = [r for r in records if r["msg"] == "still running"]
    assert beats and all(r["step"] == "convert" and isinstance(r["elapsed_s"], int) for r in beats)


@pytest.mark.process
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


@pytest.mark.process
def test_a_killed_command_and_a_missing_program_are_reported(tmp_path):
    killed = py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "trtllm-build")
    with pytest.raises(EntrypointError, match="trtllm-build was killed by signal 9"):
        run_commands([killed], tmp_path / "log", Log(stream=io.StringIO()), {})
    with pytest.raises(EntrypointError, match=r"cannot run trtllm-build \(/nonexistent/trtllm-build\)"):
        run_commands(
            [Command(("/nonexistent/trtllm-build",), "trtllm-build")], tmp_path / "log", Log(stream=io.StringIO()), {}
        )


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
    paths = install_doubles(
        tmp_path / "doubles", trtllm_version="0.17.0", tensorrt_version="10.8.0.43", with_app=True, templates_src=None
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    records = tmp_path / "records"
    return SimpleNamespace(
        paths=paths,
        model=model,
        records=records,
        env=double_environ(paths, records),
        facts=image_facts("25.01", paths["app"]),
        cache=EngineCache(tmp_path / "engines"),
    )


@pytest.mark.process
def test_engine_builder_publishes_only_the_engine(doubles):
    chosen = settings(tp_size=2)
    llama = models.Converter("llama", ())
    build = engine_builder(doubles.facts, chosen, doubles.model, llama, Log(stream=io.StringIO()), doubles.env)
    entry, built = doubles.cache.ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert built
    assert sorted(p.name for p in entry.iterdir()) == [
        "build.log",
        "config.json",
        "rank0.engine",
        "rank1.engine",
        "stamp.json",
    ]
    (convert_call,) = read_records(doubles.records, "convert_checkpoint")
    (build_call,) = read_records(doubles.records, "trtllm-build")
    # Built in the cache's temp dir (renamed to the entry afterwards), checkpoint inside it.
    tmp = Path(convert_call["argv"][convert_call["argv"].index("--output_dir") + 1]).parent
    assert tmp.parent == entry.parent and tmp.name.startswith("." + "k" * 20 + ".new-")
    convert, trtllm_build = build_commands(doubles.facts, chosen, doubles.model, tmp, tmp / "checkpoint", llama)
    assert convert_call["argv"] == list(convert.argv[2:]) and build_call["argv"] == list(trtllm_build.argv[1:])
    assert "$ python3 " in (entry / "build.log").read_text()


@pytest.mark.process
def test_engine_builder_failure_publishes_nothing(doubles):
    env = {**doubles.env, "TRTLLM_BUILD_DOUBLE_FAIL": "1"}
    build = engine_builder(
        doubles.facts, settings(), doubles.model, models.Converter("llama", ()), Log(stream=io.StringIO()), env
    )
    with pytest.raises(EntrypointError, match="trtllm-build exited with code 1") as caught:
        doubles.cache.ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert "build failed" in caught.value.message, "the error carries the tail of the program's output"
    kept = doubles.cache.root / f"{'k' * 20}.failed-{os.getpid()}.log"
    assert sorted(p.name for p in doubles.cache.root.iterdir()) == ["." + "k" * 20 + ".lock", kept.name]
    assert str(kept) in caught.value.hint


def test_engine_builder_needs_the_convert_script(doubles):
    missing = models.Converter("models/contrib/nosuch", ())
    build = engine_builder(doubles.facts, settings(), doubles.model, missing, Log(stream=io.StringIO()), doubles.env)
    with pytest.raises(EntrypointError, match="models/contrib/nosuch/convert_checkpoint.py does not exist"):
        doubles.cache.ensure("k" * 20, {}, build, timeout_s=5, log=Log(stream=io.StringIO()))
    assert read_records(doubles.records, "convert_checkpoint") == []
