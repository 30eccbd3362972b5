"""flagcheck: the flags our plans pass, compared with each program's --help; against the doubles (which answer with
the flags of the real program at that release) and against the real tritonserver 2.51.0."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.doubles import double_environ, install_doubles
from harness.image_data import image_facts, model_table
from trtllm_entrypoint.config.settings import Settings
from trtllm_entrypoint.engine import build as engine_build
from trtllm_entrypoint.inspection import flags as flagcheck
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.model import support as models

OPENAI = "openai_frontend/main.py"


def uses_for(tag: str, app_dir: Path = Path("/app")) -> dict[str, flagcheck.ProgramUse]:
    facts = image_facts(tag, app_dir)
    settings = Settings.from_env({"CACHE_DIR": "/tmp"}, facts)
    return {use.program: use for use in flagcheck.planned_uses(facts, model_table(), settings)}


def test_the_flags_come_from_the_plans():
    uses = uses_for("24.05")
    facts = image_facts("24.05")
    settings = dataclasses.replace(
        Settings.from_env({"CACHE_DIR": "/tmp"}, facts), enable_kv_cache_reuse=True, tp_size=2
    )
    build = engine_build.trtllm_build_argv(facts, settings, "float16", Path("/c"), Path("/o"))
    assert set(uses["trtllm-build"].flags) == flagcheck.flags_in(build)
    assert {"--max_output_len", "--paged_kv_cache", "--use_paged_context_fmha", "--workers"} <= set(
        uses["trtllm-build"].flags
    )
    server = launch.tritonserver_argv(settings, Path("/r"), world_size=2, uid=1000)
    assert set(uses["tritonserver"].flags) == flagcheck.flags_in(server) >= {"--load-model", "--model-repository"}
    assert {"--max_seq_len", "--kv_cache_type"} <= set(uses_for("26.07")["trtllm-build"].flags)


def test_every_converter_the_data_names_for_the_tag_is_checked():
    old, new = uses_for("24.06"), uses_for("25.06")
    assert "--qwen_type" in old["examples/qwen/convert_checkpoint.py"].flags  # only 0.10.0's qwen converter
    assert "--qwen_type" not in new["examples/models/core/qwen/convert_checkpoint.py"].flags
    assert "examples/models/contrib/falcon/convert_checkpoint.py" in new
    assert "examples/quantization/quantize.py" in old and "--qformat" in old["examples/quantization/quantize.py"].flags
    assert "examples/phi/convert_checkpoint.py" in uses_for("24.04")  # phi-2's, at 0.9.0


def test_the_help_texts_are_read_for_their_flags():
    argparse_help = "usage: trtllm-build [-h] [--max_seq_len MAX_SEQ_LEN]\n  --kv_cache_type {paged,disabled}\n"
    triton_help = "  --model-repository <string>\n\tEquivalent to --model-store.\n  --exit-timeout-secs <integer>\n"
    assert flagcheck.accepted_flags(argparse_help) == {"--max_seq_len", "--kv_cache_type"}
    assert flagcheck.accepted_flags(triton_help) == {"--model-repository", "--model-store", "--exit-timeout-secs"}
    assert flagcheck.flags_in(["x", "--a=1", "--b", "2", "-n", "c"]) == {"--a", "--b"}


def doubles_check(tmp_path: Path, tag: str, installed: str) -> dict[str, flagcheck.ProgramCheck]:
    """Our plans for `tag` checked against the doubles of TensorRT-LLM `installed`."""
    paths = install_doubles(
        tmp_path / "doubles", trtllm_version=installed, tensorrt_version="10", with_app=True, templates_src=None
    )
    env = double_environ(paths, tmp_path / "records")
    uses = [
        dataclasses.replace(use, help_argv=(str(paths["bin"] / "tritonserver"), "--help"))
        if use.program == "tritonserver"
        else use
        for use in uses_for(tag, paths["app"]).values()
        if use.program != OPENAI  # no double: the real frontend's --help is checked below
    ]
    old_environ = dict(os.environ)
    os.environ.update(PATH=env["PATH"], PYTHONPATH=env["PYTHONPATH"])
    try:
        return {check.use.program: check for check in flagcheck.check(uses)}
    finally:
        os.environ.clear()
        os.environ.update(old_environ)


@pytest.mark.process
@pytest.mark.parametrize(
    "tag,installed", [("24.05", "0.9.0"), ("24.06", "0.10.0"), ("24.08", "0.12.0"), ("25.06", "0.20.0")]
)
def test_the_plans_of_each_image_pass_its_programs_help(tmp_path, tag, installed):
    checks = doubles_check(tmp_path, tag, installed)
    assert {name: c for name, c in checks.items() if c.missing or c.error or c.unverified} == {}
    converters = {
        models.Converter.for_record(r, image_facts(tag)).folder
        for r in model_table().models
        if r["engine"] and tag in r["engine"]["tags"]
    }
    assert len(checks) == 3 + len(converters) > 10, "every converter, trtllm-build, quantize.py and tritonserver"


@pytest.mark.process
def test_a_plan_for_a_newer_release_fails_against_older_programs(tmp_path):
    """24.08's plans (TensorRT-LLM 0.12) against 0.9.0's trtllm-build: the renamed flags are caught."""
    checks = doubles_check(tmp_path, "24.08", "0.9.0")
    assert checks["trtllm-build"].missing == ("--kv_cache_type", "--max_seq_len")
    assert checks["examples/llama/convert_checkpoint.py"].missing == ()


@pytest.mark.process
def test_a_converter_the_image_lacks_is_an_error_and_a_help_without_flags_is_unverified(tmp_path):
    checks = doubles_check(tmp_path, "25.06", "0.20.0")
    shutil.rmtree(tmp_path / "doubles" / "app" / "examples" / "models" / "contrib" / "falcon")
    falcon = checks["examples/models/contrib/falcon/convert_checkpoint.py"].use
    (result,) = flagcheck.check([falcon])
    assert result.error == f"{falcon.help_argv[1]} does not exist" and result.missing == ()
    crashing = tmp_path / "crashing.py"
    crashing.write_text("import sys; sys.exit('ImportError: libcuda.so.1: cannot open shared object file')\n")
    (result,) = flagcheck.check([dataclasses.replace(falcon, help_argv=("python3", str(crashing), "--help"))])
    assert result.error is None and "listed no flags: ImportError: libcuda.so.1" in result.unverified
    (result,) = flagcheck.check([dataclasses.replace(falcon, help_argv=("/nonexistent/trtllm-build", "--help"))])
    assert result.error == "/nonexistent/trtllm-build is not installed"


def test_the_real_tritonserver_takes_every_flag_of_our_launch_plans_and_rejects_one_it_lacks(real_triton):
    ours = dataclasses.replace(uses_for("24.10")["tritonserver"], help_argv=(str(real_triton.binary), "--help"))
    typo = dataclasses.replace(ours, flags=(*ours.flags, "--exit-timeout-seconds"))
    with pytest.MonkeyPatch.context() as patch:  # the check runs --help with this process's environment
        patch.setenv("LD_LIBRARY_PATH", real_triton.environ()["LD_LIBRARY_PATH"])
        good, bad = flagcheck.check([ours, typo])  # Triton 2.51, as in 24.10
    assert good.error is None and good.missing == ()
    assert bad.missing == ("--exit-timeout-seconds",)
    # and the real program refuses such a flag at start, which is what the check spares a user
    refused = subprocess.run(
        [str(real_triton.binary), "--exit-timeout-seconds=5", "--model-repository=/nonexistent"],
        capture_output=True,
        text=True,
        env=real_triton.environ(),
        timeout=60,
    )
    assert refused.returncode != 0 and "unrecognized option '--exit-timeout-seconds=5'" in refused.stderr


def test_the_real_tritonserver_takes_a_unique_prefix_of_a_flag(real_triton):
    """getopt_long: `--model-repo` is `--model-repository`, so the server gets as far as the missing path."""
    started = subprocess.run(
        [str(real_triton.binary), "--model-repo=/nonexistent"],
        capture_output=True,
        text=True,
        env=real_triton.environ(),
        timeout=60,
    )
    assert started.returncode != 0 and "unrecognized option" not in started.stderr
    assert "failed to stat file /nonexistent" in started.stdout + started.stderr
