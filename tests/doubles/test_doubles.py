"""The doubles behave like the NVIDIA programs where our code depends on it (arguments, files, exit codes)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.doubles.double_records import parse_flags, read_records
from tests.doubles.install import double_environ, install_doubles
from tests.doubles.tritonserver_double import unparsable_placeholder


@pytest.fixture
def doubles(tmp_path):
    templates = tmp_path / "templates"
    (templates / "inflight_batcher_llm" / "tensorrt_llm").mkdir(parents=True)
    (templates / "inflight_batcher_llm" / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    paths = install_doubles(tmp_path / "root", trtllm_version="0.17.0", tensorrt_version="10.8.0.43",
                            with_app=True, templates_src=templates)
    records = tmp_path / "records"
    env = double_environ(paths, records)
    env.pop("HF_TOKEN", None)
    return paths, records, env


def run(env, *argv, cwd=None):
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_parse_flags_accepts_both_forms_and_repeats():
    flags = parse_flags(["--a=1", "--a", "2", "--switch", "--b", "x", "pos"])
    assert flags == {"a": ["1", "2"], "switch": [""], "b": ["x"], "": ["pos"]}


def test_package_doubles_report_versions(doubles):
    _, _, env = doubles
    code = ("import importlib.metadata as m, tensorrt_llm, tensorrt;"
            "print(m.version('tensorrt_llm'), tensorrt_llm.__version__, m.version('tensorrt'))")
    out = run(env, sys.executable, "-c", code)
    assert out.stdout.split() == ["0.17.0", "0.17.0", "10.8.0.43"]


def test_convert_then_build_writes_engine_dir_and_records(doubles, tmp_path):
    paths, records, env = doubles
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    env["HF_TOKEN"] = "hf_secret_value"
    convert = paths["app"] / "examples/llama/convert_checkpoint.py"
    ckpt, engine = tmp_path / "ckpt", tmp_path / "engine"
    assert run(env, sys.executable, str(convert), "--model_dir", str(model), "--output_dir", str(ckpt),
               "--dtype", "float16", "--tp_size", "2").returncode == 0
    assert json.loads((ckpt / "config.json").read_text())["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}
    build = run(env, "trtllm-build", f"--checkpoint_dir={ckpt}", "--output_dir", str(engine),
                "--max_batch_size", "8", "--gemm_plugin", "auto")
    assert build.returncode == 0, build.stderr
    config = json.loads((engine / "config.json").read_text())
    assert config["version"] == "0.17.0"
    assert config["build_config"] == {"max_batch_size": 8, "gemm_plugin": "auto"}
    assert sorted(p.name for p in engine.glob("rank*.engine")) == ["rank0.engine", "rank1.engine"]
    [rec] = read_records(records, "trtllm-build")
    assert rec["env"]["HF_TOKEN_SET"] is True
    assert "hf_secret_value" not in (records / "trtllm-build.jsonl").read_text()


def test_build_failure_and_quantize(doubles, tmp_path):
    paths, records, env = doubles
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    failing = run({**env, "TRTLLM_BUILD_DOUBLE_FAIL": "1"}, "trtllm-build", "--checkpoint_dir", str(tmp_path / "ckpt"),
                  "--output_dir", str(tmp_path / "engine"))
    assert failing.returncode == 1 and not (tmp_path / "engine").exists()
    quantize = paths["app"] / "examples/quantization/quantize.py"
    missing = run(env, sys.executable, str(quantize), "--model_dir", str(tmp_path / "nope"),
                  "--output_dir", str(tmp_path / "q"), "--qformat", "fp8")
    assert missing.returncode == 1 and "config.json" in missing.stderr
    assert read_records(records, "quantize")[0]["argv"][-1] == "fp8"


def test_nvidia_smi_formats(doubles):
    _, _, env = doubles
    query = ["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version", "--format=csv,noheader"]
    assert run(env, *query).stdout == "0, NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 570.124.06\n"
    two = {**env, "NVIDIA_SMI_DOUBLE_GPUS": "NVIDIA L40S|8.9|46068;NVIDIA L40S|8.9|46068"}
    assert run(two, "nvidia-smi", "-L").stdout.splitlines()[1].startswith("GPU 1: NVIDIA L40S (UUID: GPU-")
    none = run({**env, "NVIDIA_SMI_DOUBLE_GPUS": "none"}, *query)
    assert (none.returncode, none.stdout.strip()) == (6, "No devices were found")


def test_mpirun_execs_first_context(doubles):
    _, records, env = doubles
    out = run(env, "mpirun", "--allow-run-as-root", "-n", "1", sys.executable, "-c", "print('rank0')", ":",
              "-n", "1", "false")
    assert out.returncode == 0 and out.stdout.strip() == "rank0"
    [rec] = read_records(records, "mpirun")
    assert rec["programs"] == [[sys.executable, "-c", "print('rank0')"], ["false"]]


def test_tritonserver_refuses_unfilled_or_empty_repository(doubles, tmp_path):
    _, _, env = doubles
    repo = tmp_path / "repo"
    assert run(env, "tritonserver", f"--model-repository={repo}").returncode == 1
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('max_batch_size: ${triton_max_batch_size}\n')
    refused = run(env, "tritonserver", "--model-store", str(repo))
    assert refused.returncode == 1 and "config.pbtxt:1: unfilled" in refused.stderr
    assert run(env, "tritonserver", "--help").returncode == 0


def test_tritonserver_placeholder_check_follows_protobuf_syntax():
    # Quoted "${name}" values are the backend's own "unset" marker and load in real Triton.
    assert unparsable_placeholder('parameters { value { string_value: "${x}" } }  # ${comment}') is None
    assert unparsable_placeholder('name: "a"\nmax_batch_size: ${b}\n') == 2


def test_tritonserver_serves_health_and_stops_on_sigterm(doubles, tmp_path):
    _, records, env = doubles
    repo = tmp_path / "repo"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\n')
    port = free_port()
    proc = subprocess.Popen(["tritonserver", f"--model-repository={repo}", "--http-port", str(port)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "Started HTTPService" in proc.stderr.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as response:
            assert response.status == 200
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/nothing", timeout=5)
        assert missing.value.code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert read_records(records, "tritonserver")[0]["models"] == ["ensemble"]
