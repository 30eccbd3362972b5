import importlib.util
import io
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from trtllm_entrypoint import repository
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.facts import ImageFacts
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.repository import UNSET
from trtllm_entrypoint.settings import Settings

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "upstream"
BACKEND_VERSIONS = ("v0.7.0", "v0.8.0", "v0.12.0", "v0.13.0", "v0.17.0", "v0.19.0")
TEMPLATE_ROOTS = [SHARED / "tensorrtllm_backend" / v for v in BACKEND_VERSIONS] + \
    [SHARED / "tensorrt_llm" / "triton_backend" / "all_models"]
TRTLLM_ROOT = TEMPLATE_ROOTS[-1]
FACTS = ImageFacts(tag="25.05", tensorrt_llm="0.19.0", tensorrt="10.9.0.34", triton="2.58.0",
                   workflows=("engine", "llmapi"), engine_deprecated=False, openai_frontend=True,
                   app_dir=Path("/app"))
ENGINE = Path("/var/cache/trtllm/engines/abc")
TOKENIZER = Path("/var/cache/trtllm/models/org--name")


def make_settings(**env):
    return Settings.from_env({"CACHE_DIR": "/var/cache/trtllm", **env}, FACTS)


def need(root):
    if not (root / "inflight_batcher_llm").is_dir() and not (root / "llmapi").is_dir():
        pytest.skip(f"upstream templates not available at {root}")
    return root


def fill(root, dest, settings=None, engine_dir=ENGINE, log=None):
    settings = settings or make_settings()
    values = repository.fill_values(settings, FACTS, engine_dir, TOKENIZER)
    plan = repository.plan_fill(root, values, settings=settings, model_path=TOKENIZER)
    repository.write_repository(plan, dest, root, log=log)
    return plan


def parameters(config_path):
    from trtllm_entrypoint import pbtxt
    return {k: v["string_value"] for k, v in pbtxt.map_entries(pbtxt.parse(config_path.read_text())
                                                                 .get("parameters")).items()}


@pytest.mark.parametrize("root", TEMPLATE_ROOTS, ids=lambda p: p.name if p.name != "all_models" else "trtllm-1.2")
def test_every_upstream_version_fills_parses_and_is_wired(root, tmp_path):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    need(root)
    dest = tmp_path / "repo"
    plan = fill(root, dest)
    models = sorted(p.name for p in dest.iterdir())
    assert models == sorted(m.name for m in plan.models)
    assert {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"} <= set(models)
    for config_path in dest.glob("*/config.pbtxt"):
        text = config_path.read_text()
        assert repository.structural_placeholders(text) == set(), config_path
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert config.name == config_path.parent.name
        assert config.max_batch_size == 64
    repository.validate_repository(dest)
    trtllm = parameters(dest / "tensorrt_llm" / "config.pbtxt")
    assert trtllm["gpt_model_path"] == str(ENGINE)
    assert trtllm["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert parameters(dest / "preprocessing" / "config.pbtxt")["tokenizer_dir"] == str(TOKENIZER)
    assert "decoupled: false" in (dest / "tensorrt_llm" / "config.pbtxt").read_text()


@pytest.mark.parametrize("root", TEMPLATE_ROOTS, ids=lambda p: p.name if p.name != "all_models" else "trtllm-1.2")
def test_effective_values_cover_every_optional_parameter(root, tmp_path):
    need(root)
    plan = fill(root, tmp_path / "repo")
    texts = [(tmp_path / "repo" / m.name / "config.pbtxt").read_text() for m in plan.models]
    optional = set().union(*(repository.placeholders(t) for t in
                             ((root / "inflight_batcher_llm" / m / "config.pbtxt").read_text()
                              for m in repository.ENGINE_MODELS
                              if (root / "inflight_batcher_llm" / m / "config.pbtxt").exists())))
    for name, value in plan.effective.items():
        assert name in optional
        if value == UNSET:
            assert name in repository.INTENTIONALLY_UNSET
            assert any("${%s}" % name in t for t in texts)  # left for the backend to default
    assert plan.effective["engine_dir"] == str(ENGINE)
    assert plan.effective["batching_strategy"] == "inflight_fused_batching"


def test_decoupled_and_batch_values_follow_settings(tmp_path):
    root = need(TRTLLM_ROOT)
    settings = make_settings(DECOUPLED="true", MAX_BATCH_SIZE="8", ENABLE_KV_CACHE_REUSE="1",
                             KV_CACHE_FREE_GPU_MEM_FRACTION="0.5", MAX_BEAM_WIDTH="2")
    fill(root, tmp_path / "repo", settings)
    text = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in text and "max_batch_size: 8" in text
    params = parameters(tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt")
    assert (params["enable_kv_cache_reuse"], params["kv_cache_free_gpu_mem_fraction"],
            params["max_beam_width"]) == ("true", "0.5", "2")
    assert "decoupled: true" in (tmp_path / "repo" / "tensorrt_llm_bls" / "config.pbtxt").read_text()



def test_instance_counts_follow_settings(tmp_path):
    root = need(TRTLLM_ROOT)
    fill(root, tmp_path / "repo", make_settings(PREPROCESSING_INSTANCES="3", POSTPROCESSING_INSTANCES="5"))
    from trtllm_entrypoint import pbtxt
    counts = {model: pbtxt.parse((tmp_path / "repo" / model / "config.pbtxt").read_text())["instance_group"][0]
              ["count"] for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls")}
    assert counts == {"preprocessing": 3, "postprocessing": 5, "tensorrt_llm_bls": 1}

def write_template(root, model, text):
    (root / "inflight_batcher_llm" / model).mkdir(parents=True, exist_ok=True)
    (root / "inflight_batcher_llm" / model / "config.pbtxt").write_text(text)


def copy_templates(tmp_path):
    root = tmp_path / "templates"
    shutil.copytree(need(TRTLLM_ROOT) / "inflight_batcher_llm", root / "inflight_batcher_llm")
    return root


def test_unknown_structural_placeholder_fails_naming_it(tmp_path):
    root = copy_templates(tmp_path)
    path = root / "inflight_batcher_llm" / "postprocessing" / "config.pbtxt"
    path.write_text(path.read_text() + "\nversion_policy: { latest: { num_versions: ${brand_new_knob} } }\n")
    settings = make_settings()
    with pytest.raises(EntrypointError) as info:
        repository.plan_fill(root, repository.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    assert "brand_new_knob" in info.value.message and str(path) in info.value.message
    assert not (tmp_path / "repo").exists()


def test_unknown_parameter_placeholder_fails_naming_it(tmp_path):
    root = copy_templates(tmp_path)
    path = root / "inflight_batcher_llm" / "tensorrt_llm" / "config.pbtxt"
    path.write_text(path.read_text() + '\nparameters: { key: "k" value: { string_value: "${mystery}" } }\n')
    settings = make_settings()
    with pytest.raises(EntrypointError, match="mystery"):
        repository.plan_fill(root, repository.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)


def test_missing_engine_dir_is_reported_not_left_as_placeholder(tmp_path):
    root = copy_templates(tmp_path)
    settings = make_settings()
    with pytest.raises(EntrypointError, match="engine_dir"):
        repository.plan_fill(root, repository.fill_values(settings, FACTS, None, TOKENIZER), settings=settings)


def test_placeholder_classification():
    text = ('backend: "${triton_backend}"\nmax_batch_size: ${mbs}\n'
            'parameters { key: "e" value { string_value: "${engine_dir}" } }\n'
            '#   string_value: "${enable_trt_overlap}"\n# count: ${commented}\n')
    assert repository.placeholders(text) == {"triton_backend", "mbs", "engine_dir", "enable_trt_overlap",
                                             "commented"}
    assert repository.structural_placeholders(text) == {"triton_backend", "mbs"}


def test_values_are_escaped_inside_strings():
    text = 'parameters { key: "t" value { string_value: "${tokenizer_dir}" } }'
    rendered = repository.render(text, {"tokenizer_dir": 'C:\\dir "x"'})
    assert parameters_from_text(rendered)["t"] == 'C:\\dir "x"'


def parameters_from_text(text):
    from trtllm_entrypoint import pbtxt
    return {k: v["string_value"] for k, v in pbtxt.map_entries(pbtxt.parse(text)["parameters"]).items()}


def test_served_model_name_renames_the_ensemble_only(tmp_path):
    root = need(TRTLLM_ROOT)
    fill(root, tmp_path / "repo", make_settings(SERVED_MODEL_NAME="llama-3"))
    names = sorted(p.name for p in (tmp_path / "repo").iterdir())
    assert names == ["llama-3", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls"]
    assert '\nname: "llama-3"' in (tmp_path / "repo" / "llama-3" / "config.pbtxt").read_text()
    assert parameters(tmp_path / "repo" / "tensorrt_llm_bls" / "config.pbtxt")["tensorrt_llm_model_name"] == \
        "tensorrt_llm"


def test_served_model_name_may_not_take_an_inner_name(tmp_path):
    with pytest.raises(UsageError, match="preprocessing"):
        fill(need(TRTLLM_ROOT), tmp_path / "repo", make_settings(SERVED_MODEL_NAME="preprocessing"))
    assert not (tmp_path / "repo").exists()


def llmapi_templates(tmp_path):
    root = tmp_path / "templates"
    shutil.copytree(need(TRTLLM_ROOT) / "llmapi", root / "llmapi")
    (root / "llmapi" / "tensorrt_llm" / "1" / "model.py").write_text("# the backend's model\n")
    return root


def test_llmapi_writes_model_yaml_from_settings(tmp_path):
    root = llmapi_templates(tmp_path)
    settings = make_settings(WORKFLOW="llmapi", TP_SIZE="2", DECOUPLED="yes", MAX_BATCH_SIZE="32",
                             DTYPE="bfloat16", ENABLE_KV_CACHE_REUSE="true", KV_CACHE_FREE_GPU_MEM_FRACTION="0.00001",
                             SERVED_MODEL_NAME="chat")
    plan = fill(root, tmp_path / "repo", settings, engine_dir=None)
    model_dir = tmp_path / "repo" / "chat"
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["chat"]
    assert (model_dir / "1" / "model.py").read_text() == "# the backend's model\n"
    assert yaml.safe_load((model_dir / "1" / "model.yaml").read_text()) == {
        "model": str(TOKENIZER), "backend": "pytorch", "tensor_parallel_size": 2, "pipeline_parallel_size": 1,
        "dtype": "bfloat16", "max_batch_size": 32, "max_num_tokens": 8192, "max_seq_len": 4096,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.00001, "enable_block_reuse": True},
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }
    assert '\nname: "chat"' in (model_dir / "config.pbtxt").read_text()
    assert plan.effective["kv_cache_config.enable_block_reuse"] == "true"
    assert plan.effective["tensor_parallel_size"] == "2"


def test_yaml_strings_are_quoted_safely():
    text = repository.to_yaml({"model": 'a: "b" # c\n', "n": {"x": False}})
    assert yaml.safe_load(text) == {"model": 'a: "b" # c\n', "n": {"x": False}}


def test_existing_repository_is_replaced(tmp_path):
    root = need(TRTLLM_ROOT)
    dest = tmp_path / "repo"
    (dest / "stale_model").mkdir(parents=True)
    fill(root, dest)
    assert not (dest / "stale_model").exists() and (dest / "ensemble" / "config.pbtxt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no staging or old copies left


def test_failed_validation_keeps_the_earlier_repository(tmp_path, monkeypatch):
    root = need(TRTLLM_ROOT)
    dest = tmp_path / "repo"
    fill(root, dest)
    before = (dest / "ensemble" / "config.pbtxt").read_text()

    def broken(path, log=None):
        raise EntrypointError("invalid")

    monkeypatch.setattr(repository, "validate_repository", broken)
    with pytest.raises(EntrypointError):
        fill(root, dest, make_settings(MAX_BATCH_SIZE="2"))
    assert (dest / "ensemble" / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_read_only_templates_are_copied_writable(tmp_path):
    root = llmapi_templates(tmp_path)
    for path in sorted(root.rglob("*"), reverse=True):
        path.chmod(stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0))
    root.chmod(0o500)
    try:
        fill(root, tmp_path / "repo", make_settings(WORKFLOW="llmapi"), engine_dir=None)
        written = tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py"
        assert os.stat(written).st_mode & stat.S_IWUSR
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o700)


@pytest.mark.parametrize("dest", ["/mnt/models", "/mnt/models/repo"])
def test_refuses_kserve_model_mount(dest, tmp_path):
    root = need(TRTLLM_ROOT)
    settings = make_settings()
    plan = repository.plan_fill(root, repository.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    with pytest.raises(UsageError, match="/mnt/models"):
        repository.write_repository(plan, Path(dest), root)


def test_refuses_a_destination_overlapping_the_templates(tmp_path):
    root = copy_templates(tmp_path)
    settings = make_settings()
    plan = repository.plan_fill(root, repository.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    with pytest.raises(UsageError, match="overlaps"):
        repository.write_repository(plan, root / "inflight_batcher_llm", root)
    assert (root / "inflight_batcher_llm" / "ensemble" / "config.pbtxt").is_file()


MODEL = 'name: "{name}"\nbackend: "python"\ninput [ {{ name: "IN" data_type: TYPE_INT32 dims: [1] }} ]\n' \
        'output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [1] }} ]\n'
ENSEMBLE = ('name: "ensemble"\nplatform: "ensemble"\n'
            'input [ {{ name: "x" data_type: TYPE_INT32 dims: [1] }} {extra_input} ]\n'
            'output [ {{ name: "y" data_type: TYPE_INT32 dims: [1] }} ]\n'
            'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1\n'
            '  input_map {{ key: "{key}" value: "x" }} output_map {{ key: "OUT" value: "y" }} }} ] }}\n')


def small_repository(tmp_path, step="m", key="IN", extra_input=""):
    for name, text in (("m", MODEL.format(name="m")),
                       ("ensemble", ENSEMBLE.format(step=step, key=key, extra_input=extra_input))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(text)
    return tmp_path


def test_wiring_holds_for_a_correct_ensemble(tmp_path):
    repository.validate_repository(small_repository(tmp_path))


@pytest.mark.parametrize("kwargs, message", [
    ({"step": "missing"}, "model 'missing', which is not in the repository"),
    ({"key": "NOPE"}, "maps input(s) NOPE of model 'm'"),
    ({"extra_input": ', { name: "z" data_type: TYPE_INT32 dims: [1] }'}, "inputs never used ['z']"),
])
def test_wiring_errors_are_named(tmp_path, kwargs, message):
    with pytest.raises(EntrypointError) as info:
        repository.validate_repository(small_repository(tmp_path, **kwargs))
    assert message in info.value.message


def test_validation_rejects_leftover_structural_placeholders_and_bad_names(tmp_path):
    root = small_repository(tmp_path)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="m") + "max_batch_size: ${triton_max_batch_size}\n")
    with pytest.raises(EntrypointError, match="triton_max_batch_size"):
        repository.validate_repository(root)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="other"))
    with pytest.raises(EntrypointError, match="differs from its directory"):
        repository.validate_repository(root)


def test_protobuf_check_is_skipped_and_logged_without_tritonclient(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("tritonclient") else real_find_spec(name, *a))
    stream = io.StringIO()
    repository.validate_repository(small_repository(tmp_path), log=Log(stream=stream))
    assert "protobuf check skipped" in stream.getvalue()


def test_protobuf_check_catches_what_the_small_parser_accepts(tmp_path):
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    root = small_repository(tmp_path)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="m") + "no_such_field: 1\n")
    with pytest.raises(EntrypointError, match="not a valid Triton ModelConfig"):
        repository.validate_repository(root)
