import fcntl
import importlib.util
import io
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.image_data import ENGINE_DEFAULTS, FACTS
from harness.upstream_files import upstream_path
from tests import factories
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.repository import check as repository_check
from trtllm_entrypoint.repository import fill as filling
from trtllm_entrypoint.repository import parameters as fill_parameters
from trtllm_entrypoint.repository import write as repository
from trtllm_entrypoint.repository.fill import UNSET
from trtllm_images.sources import vendor

BACKEND_VERSIONS = ("v0.7.0", "v0.8.0", "v0.12.0", "v0.13.0", "v0.17.0", "v0.19.0")
# Template sets in the upstream layout (harness/upstream_files.py).
TEMPLATE_ROOTS = [f"tensorrtllm_backend/{v}" for v in BACKEND_VERSIONS] + ["tensorrt_llm/triton_backend/all_models"]
TRTLLM_ROOT = TEMPLATE_ROOTS[-1]
ENGINE = Path("/var/cache/trtllm/engines/abc")
TOKENIZER = Path("/var/cache/trtllm/models/org--name")


def make_settings(**env):
    return factories.settings(**env)


def need(root: str) -> Path:
    return upstream_path(root)


def fill(root, dest, settings=None, engine_dir=ENGINE, log=None):
    settings = settings or make_settings()
    values = filling.fill_values(settings, FACTS, engine_dir, TOKENIZER)
    plan = filling.plan_fill(root, values, settings=settings, model_path=TOKENIZER)
    os.close(repository.write_named(plan, dest, root, log or Log(stream=io.StringIO()), timeout_s=5))
    return plan


def parameters(config_path):
    from trtllm_entrypoint.repository import pbtxt

    return {
        k: v["string_value"]
        for k, v in pbtxt.map_entries(pbtxt.parse(config_path.read_text()).get("parameters")).items()
    }


@pytest.mark.parametrize("root", TEMPLATE_ROOTS, ids=lambda p: p.split("/")[1] if "backend/" in p else "trtllm-1.2")
def test_every_upstream_version_fills_parses_and_is_wired(root, tmp_path):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    root = need(root)
    dest = tmp_path / "repo"
    plan = fill(root, dest)
    models = sorted(p.name for p in dest.iterdir() if p.is_dir())
    assert models == sorted(m.name for m in plan.models)
    assert {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"} <= set(models)
    for config_path in dest.glob("*/config.pbtxt"):
        text = config_path.read_text()
        assert filling.structural_placeholders(text) == set(), config_path
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert config.name == config_path.parent.name
        assert config.max_batch_size == 64
    repository_check.validate_repository(dest)
    trtllm = parameters(dest / "tensorrt_llm" / "config.pbtxt")
    assert trtllm["gpt_model_path"] == str(ENGINE)
    assert trtllm["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert parameters(dest / "preprocessing" / "config.pbtxt")["tokenizer_dir"] == str(TOKENIZER)
    assert "decoupled: false" in (dest / "tensorrt_llm" / "config.pbtxt").read_text()


@pytest.mark.parametrize("root", TEMPLATE_ROOTS, ids=lambda p: p.split("/")[1] if "backend/" in p else "trtllm-1.2")
def test_effective_values_cover_every_optional_parameter(root, tmp_path):
    root = need(root)
    plan = fill(root, tmp_path / "repo")
    texts = [(tmp_path / "repo" / m.name / "config.pbtxt").read_text() for m in plan.models]
    optional = set().union(
        *(
            filling.placeholders(t)
            for t in (
                (root / "inflight_batcher_llm" / m / "config.pbtxt").read_text()
                for m in contract.ENGINE_MODELS
                if (root / "inflight_batcher_llm" / m / "config.pbtxt").exists()
            )
        )
    )
    for name, value in plan.effective.items():
        assert name in optional
        if value == UNSET:
            assert name in fill_parameters.INTENTIONALLY_UNSET
            assert any(f"${{{name}}}" in t for t in texts)  # left for the backend to default
    assert plan.effective["engine_dir"] == str(ENGINE)
    assert plan.effective["batching_strategy"] == "inflight_fused_batching"


def test_decoupled_and_batch_values_follow_settings(tmp_path):
    root = need(TRTLLM_ROOT)
    settings = make_settings(
        DECOUPLED="true",
        MAX_BATCH_SIZE="8",
        ENABLE_KV_CACHE_REUSE="1",
        KV_CACHE_FREE_GPU_MEM_FRACTION="0.5",
        MAX_BEAM_WIDTH="2",
        ENABLE_BLS="true",
    )
    fill(root, tmp_path / "repo", settings)
    text = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in text and "max_batch_size: 8" in text
    params = parameters(tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt")
    assert (params["enable_kv_cache_reuse"], params["kv_cache_free_gpu_mem_fraction"], params["max_beam_width"]) == (
        "true",
        "0.5",
        "2",
    )
    assert "decoupled: true" in (tmp_path / "repo" / "tensorrt_llm_bls" / "config.pbtxt").read_text()


def test_instance_counts_follow_settings(tmp_path):
    root = need(TRTLLM_ROOT)
    fill(
        root,
        tmp_path / "repo",
        make_settings(PREPROCESSING_INSTANCES="3", POSTPROCESSING_INSTANCES="5", ENABLE_BLS="true"),
    )
    from trtllm_entrypoint.repository import pbtxt

    counts = {
        model: pbtxt.parse((tmp_path / "repo" / model / "config.pbtxt").read_text())["instance_group"][0]["count"]
        for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls")
    }
    assert counts == {"preprocessing": 3, "postprocessing": 5, "tensorrt_llm_bls": 1}


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
        filling.plan_fill(root, filling.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    assert "brand_new_knob" in info.value.message and str(path) in info.value.message
    assert not (tmp_path / "repo").exists()


def test_unknown_parameter_placeholder_fails_naming_it(tmp_path):
    root = copy_templates(tmp_path)
    path = root / "inflight_batcher_llm" / "tensorrt_llm" / "config.pbtxt"
    path.write_text(path.read_text() + '\nparameters: { key: "k" value: { string_value: "${mystery}" } }\n')
    settings = make_settings()
    with pytest.raises(EntrypointError, match="mystery"):
        filling.plan_fill(root, filling.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)


def test_missing_engine_dir_is_reported_not_left_as_placeholder(tmp_path):
    root = copy_templates(tmp_path)
    settings = make_settings()
    with pytest.raises(EntrypointError, match="engine_dir"):
        filling.plan_fill(root, filling.fill_values(settings, FACTS, None, TOKENIZER), settings=settings)


def test_placeholder_classification():
    text = (
        'backend: "${triton_backend}"\nmax_batch_size: ${mbs}\n'
        'parameters { key: "e" value { string_value: "${engine_dir}" } }\n'
        '#   string_value: "${enable_trt_overlap}"\n# count: ${commented}\n'
    )
    assert filling.placeholders(text) == {"triton_backend", "mbs", "engine_dir", "enable_trt_overlap", "commented"}
    assert filling.structural_placeholders(text) == {"triton_backend", "mbs"}


def test_values_are_escaped_inside_strings():
    text = 'parameters { key: "t" value { string_value: "${tokenizer_dir}" } }'
    rendered = filling.render(text, {"tokenizer_dir": 'C:\\dir "x"'})
    assert parameters_from_text(rendered)["t"] == 'C:\\dir "x"'


def parameters_from_text(text):
    from trtllm_entrypoint.repository import pbtxt

    return {k: v["string_value"] for k, v in pbtxt.map_entries(pbtxt.parse(text)["parameters"]).items()}


def test_served_model_name_renames_the_ensemble_only(tmp_path):
    root = need(TRTLLM_ROOT)
    fill(root, tmp_path / "repo", make_settings(SERVED_MODEL_NAME="llama-3", ENABLE_BLS="yes"))
    names = sorted(p.name for p in (tmp_path / "repo").iterdir() if p.is_dir())
    assert names == ["llama-3", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls"]
    assert '\nname: "llama-3"' in (tmp_path / "repo" / "llama-3" / "config.pbtxt").read_text()
    assert (
        parameters(tmp_path / "repo" / "tensorrt_llm_bls" / "config.pbtxt")["tensorrt_llm_model_name"] == "tensorrt_llm"
    )


def test_the_bls_model_is_written_only_when_asked_for(tmp_path):
    root = need(TRTLLM_ROOT)
    fill(root, tmp_path / "repo")
    assert sorted(p.name for p in (tmp_path / "repo").iterdir() if p.is_dir()) == [
        "ensemble",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm",
    ]
    fill(root, tmp_path / "repo", make_settings(ENABLE_BLS="true"))
    assert (tmp_path / "repo" / "tensorrt_llm_bls" / "config.pbtxt").is_file()


def test_templates_dir_may_name_all_models_or_the_seeds_folder(tmp_path):
    root = copy_templates(tmp_path)
    (root / "inflight_batcher_llm" / "preprocessing" / "1").mkdir(parents=True, exist_ok=True)
    (root / "inflight_batcher_llm" / "preprocessing" / "1" / "model.py").write_text("# tokenizer model\n")
    whole = fill(root, tmp_path / "repo-a")
    folder = fill(root / "inflight_batcher_llm", tmp_path / "repo-b")
    assert [m.files for m in whole.models] == [m.files for m in folder.models]
    assert (tmp_path / "repo-b" / "preprocessing" / "1" / "model.py").read_text() == "# tokenizer model\n"


@pytest.mark.parametrize("where,found", [("missing", "does not exist"), ("empty", "has neither")])
def test_templates_dir_without_templates_is_bad_input(tmp_path, where, found):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=f"TEMPLATES_DIR=.*{found}"):
        filling.workflow_templates(tmp_path / where, "engine")


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
    settings = make_settings(
        WORKFLOW="llmapi",
        TP_SIZE="2",
        DECOUPLED="yes",
        MAX_BATCH_SIZE="32",
        DTYPE="bfloat16",
        ENABLE_KV_CACHE_REUSE="true",
        KV_CACHE_FREE_GPU_MEM_FRACTION="0.00001",
        SERVED_MODEL_NAME="chat",
    )
    plan = fill(root, tmp_path / "repo", settings, engine_dir=None)
    model_dir = tmp_path / "repo" / "chat"
    assert sorted(p.name for p in (tmp_path / "repo").iterdir() if p.is_dir()) == ["chat"]
    assert (model_dir / "1" / "model.py").read_text() == "# the backend's model\n"
    assert yaml.safe_load((model_dir / "1" / "model.yaml").read_text()) == {
        "model": str(TOKENIZER),
        "backend": "pytorch",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "dtype": "bfloat16",
        "max_batch_size": 32,
        "max_num_tokens": ENGINE_DEFAULTS["max_num_tokens"],
        "max_seq_len": ENGINE_DEFAULTS["max_seq_len"],
        "kv_cache_config": {"free_gpu_memory_fraction": 0.00001, "enable_block_reuse": True},
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }
    assert '\nname: "chat"' in (model_dir / "config.pbtxt").read_text()
    assert plan.effective["kv_cache_config.enable_block_reuse"] == "true"
    assert plan.effective["tensor_parallel_size"] == "2"


def test_yaml_strings_are_quoted_safely():
    text = filling.to_yaml({"model": 'a: "b" # c\n', "n": {"x": False}})
    assert yaml.safe_load(text) == {"model": 'a: "b" # c\n', "n": {"x": False}}


def test_a_repository_we_wrote_is_replaced_when_the_settings_change(tmp_path):
    root = need(TRTLLM_ROOT)
    dest = tmp_path / "repo"
    fill(root, dest)
    fill(root, dest, make_settings(MAX_BATCH_SIZE="2"))
    assert "max_batch_size: 2" in (dest / "ensemble" / "config.pbtxt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".repo.lock", "repo"]  # no staging or old copies left


def test_a_cached_repository_waits_for_the_lock_only_so_long_and_names_the_holder(tmp_path):
    root = need(TRTLLM_ROOT)
    settings = make_settings()
    plan = filling.plan_fill(root, filling.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    cache = tmp_path / "repositories"
    cache.mkdir()
    digest = repository.plan_digest(plan, Path(os.path.abspath(root)))
    holder = os.open(cache / f".{digest}.lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(holder, b'{"pid": 4242, "host": "replica-1", "since": "2025-01-01T00:00:00Z"}')
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(EntrypointError) as caught:
            repository.write_cached(plan, cache, root, Log(stream=io.StringIO()), timeout_s=0.3)
    finally:
        os.close(holder)
    assert "gave up after 0.3s" in caught.value.message and "pid 4242 on replica-1" in caught.value.message
    assert "LOCK_TIMEOUT_SECS" in caught.value.hint
    path, written = repository.write_cached(plan, cache, root, Log(stream=io.StringIO()), timeout_s=5)
    assert written and (path / repository.STAMP).is_file()


def test_a_mount_point_as_repository_dir_is_refused_up_front(tmp_path, monkeypatch):
    from trtllm_entrypoint.launch import preflight

    (tmp_path / "volume").mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: str(path) == str(tmp_path / "volume"))
    with pytest.raises(UsageError, match="not itself a mount point"):
        preflight.check_repository_dir(tmp_path / "volume")
    preflight.check_repository_dir(tmp_path / "volume" / "repo")


def test_an_empty_directory_is_filled_in_place(tmp_path):
    dest = tmp_path / "repo"
    dest.mkdir()
    fill(need(TRTLLM_ROOT), dest)
    assert (dest / "ensemble" / "config.pbtxt").is_file() and (dest / repository.STAMP).is_file()


@pytest.mark.parametrize("layout", ["a user's file", "a checkpoint", "a repository without our stamp"])
def test_a_directory_we_did_not_write_is_refused_and_left_untouched(tmp_path, layout):
    dest = tmp_path / "repo"
    files = {
        "a user's file": {"notes.txt": "mine"},
        "a checkpoint": {"config.json": "{}", "model.safetensors": "weights"},
        "a repository without our stamp": {"ensemble/config.pbtxt": 'name: "ensemble"'},
    }[layout]
    for name, text in files.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(text)
    with pytest.raises(UsageError, match="not written by trtllm-entrypoint"):
        fill(need(TRTLLM_ROOT), dest)
    assert {p.relative_to(dest).as_posix(): p.read_text() for p in dest.rglob("*") if p.is_file()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == [".repo.lock", "repo"]


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
    assert sorted(p.name for p in tmp_path.iterdir()) == [".repo.lock", "repo"]


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
    plan = filling.plan_fill(root, filling.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    with pytest.raises(UsageError, match="/mnt/models"):
        repository.write_named(plan, Path(dest), root, Log(stream=io.StringIO()), timeout_s=5)


def test_refuses_a_destination_overlapping_the_templates(tmp_path):
    root = copy_templates(tmp_path)
    settings = make_settings()
    plan = filling.plan_fill(root, filling.fill_values(settings, FACTS, ENGINE, TOKENIZER), settings=settings)
    with pytest.raises(UsageError, match="overlaps"):
        repository.write_named(plan, root / "inflight_batcher_llm", root, Log(stream=io.StringIO()), timeout_s=5)
    assert (root / "inflight_batcher_llm" / "ensemble" / "config.pbtxt").is_file()


MODEL = (
    'name: "{name}"\nbackend: "python"\ninput [ {{ name: "IN" data_type: TYPE_INT32 dims: [1] }} ]\n'
    'output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [1] }} ]\n'
)
ENSEMBLE = (
    'name: "ensemble"\nplatform: "ensemble"\n'
    'input [ {{ name: "x" data_type: TYPE_INT32 dims: [1] }} {extra_input} ]\n'
    'output [ {{ name: "y" data_type: TYPE_INT32 dims: [1] }} ]\n'
    'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1\n'
    '  input_map {{ key: "{key}" value: "x" }} output_map {{ key: "OUT" value: "y" }} }} ] }}\n'
)


def small_repository(tmp_path, step="m", key="IN", extra_input=""):
    for name, text in (
        ("m", MODEL.format(name="m")),
        ("ensemble", ENSEMBLE.format(step=step, key=key, extra_input=extra_input)),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(text)
    return tmp_path


def test_wiring_holds_for_a_correct_ensemble(tmp_path):
    repository_check.validate_repository(small_repository(tmp_path))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"step": "missing"}, "model 'missing', which is not in the repository"),
        ({"key": "NOPE"}, "maps input(s) NOPE of model 'm'"),
        ({"extra_input": ', { name: "z" data_type: TYPE_INT32 dims: [1] }'}, "inputs never used ['z']"),
    ],
)
def test_wiring_errors_are_named(tmp_path, kwargs, message):
    with pytest.raises(EntrypointError) as info:
        repository_check.validate_repository(small_repository(tmp_path, **kwargs))
    assert message in info.value.message


def test_validation_rejects_leftover_structural_placeholders_and_bad_names(tmp_path):
    root = small_repository(tmp_path)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="m") + "max_batch_size: ${triton_max_batch_size}\n")
    with pytest.raises(EntrypointError, match="triton_max_batch_size"):
        repository_check.validate_repository(root)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="other"))
    with pytest.raises(EntrypointError, match="differs from its directory"):
        repository_check.validate_repository(root)


def test_protobuf_check_is_skipped_and_logged_without_tritonclient(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("tritonclient") else real_find_spec(name, *a),
    )
    stream = io.StringIO()
    repository_check.validate_repository(small_repository(tmp_path), log=Log(stream=stream), kit=tmp_path / "no-kit")
    assert "warning: protobuf check skipped" in stream.getvalue(), "a skipped check is a warning, never info"


def test_protobuf_check_catches_what_the_small_parser_accepts(tmp_path):
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    root = small_repository(tmp_path)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="m") + "no_such_field: 1\n")
    with pytest.raises(EntrypointError, match="not a valid Triton ModelConfig"):
        repository_check.validate_repository(root)


@pytest.fixture(scope="session")
def validation_kit(tmp_path_factory):
    """The images' vendor/ directory, assembled from vendor.lock.json (downloaded once into the user cache)."""
    return vendor.assemble(tmp_path_factory.mktemp("vendor"), log=lambda message: None) / "validation"


KIT_CHECK = """
import sys
from pathlib import Path
from trtllm_entrypoint.repository import check as repository_check
from trtllm_entrypoint.errors import EntrypointError
try:
    repository_check.validate_repository(Path(sys.argv[1]), kit=Path(sys.argv[2]))
except EntrypointError as exc:
    print(exc.message)
import google.protobuf
print("protobuf from", google.protobuf.__file__)
"""


@pytest.mark.process
def test_the_validation_kit_checks_configs_with_its_own_protobuf_alone(tmp_path, validation_kit):
    # -S: no site-packages at all, as if the base image had no protobuf, or one of another version.
    root = small_repository(tmp_path)
    (root / "m" / "config.pbtxt").write_text(MODEL.format(name="m") + "no_such_field: 1\n")
    entrypoints = Path(repository_check.__file__).parents[2]
    result = subprocess.run(
        [sys.executable, "-S", "-c", KIT_CHECK, str(root), str(validation_kit)],
        env={"PYTHONPATH": str(entrypoints), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    error, origin = result.stdout.splitlines()
    assert "not a valid Triton ModelConfig" in error and "no_such_field" in error
    assert origin.startswith(f"protobuf from {validation_kit}/google/protobuf/")
