"""capabilities.yaml and models.yaml (the data) and trtllm_images.capabilities and
model_support (their loaders, validators and resolver)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from harness.image import TEMPLATE_SETS, templates_for
from trtllm_entrypoint.errors import UsageError
from trtllm_images import matrix, model_support
from trtllm_images.capabilities import ROOT, TagCapabilities, load_capabilities
from trtllm_images.matrix import image_matrix_json


@pytest.fixture(scope="module")
def real():
    return matrix.load(), load_capabilities(), model_support.load_models()


def caps(real, tag: str) -> TagCapabilities:
    the_matrix, capabilities, _ = real
    return capabilities.of(the_matrix.get(tag))


# --- the real data -------------------------------------------------------------------------------------------------


def test_every_tag_has_exactly_one_examples_layout_and_0_20_switches_it(real):
    the_matrix, capabilities, _ = real
    layouts = {entry.tag: capabilities.of(entry).examples_layout for entry in the_matrix.entries}
    assert {tag for tag, layout in layouts.items() if layout == "models"} == {
        e.tag for e in the_matrix.entries if e.backend.subdir
    }  # 25.06 on: the backend moved too


@pytest.mark.parametrize(
    "tag,present,absent",
    [
        ("24.02", set(), {"engine_build"}),  # TensorRT-LLM 0.8.0
        ("24.05", {"engine_build"}, {"converter_dtype_auto", "llmapi_workflow"}),
        ("24.12", {"python_3_12_wheels", "openai_frontend"}, {"app_in_image"}),
        ("25.05", {"llmapi_workflow", "app_in_image"}, {"backend_in_tensorrt_llm"}),
        ("25.09", {"engine_deprecated", "backend_in_tensorrt_llm"}, set()),
    ],
)
def test_features_per_tag(real, tag, present, absent):
    features = set(caps(real, tag).features)
    assert present <= features and not absent & features


def test_trtllm_build_flags_follow_the_release_notes(real):
    flags = {tag: set(caps(real, tag).flags["trtllm-build"]) for tag in ("24.06", "24.07", "24.08")}
    assert "--max_output_len" in flags["24.06"] and "--max_seq_len" not in flags["24.06"]  # 0.10
    assert {"--max_output_len", "--max_seq_len"} <= flags["24.07"]  # 0.11: both
    assert "--max_output_len" not in flags["24.08"] and "--kv_cache_type" in flags["24.08"]  # 0.12


def test_model_records_name_the_tags_per_workflow(real):
    the_matrix, capabilities, models = real
    record = model_support.model_record(model_support.find(models, "phi3forcausallm"), the_matrix, capabilities)
    assert record["engine"]["tags"][0] == "24.06" and record["llmapi"] is None
    qwen2 = model_support.model_record(model_support.find(models, "qwen2"), the_matrix, capabilities)
    assert qwen2["engine"]["args"] == [{"args": ["--qwen_type", "qwen2"], "tags": ["24.06"]}]
    assert qwen2["llmapi"]["tags"][0] == "25.05", "the llmapi workflow starts at 25.05, whatever the model"
    deepseek_v3 = model_support.model_record(model_support.find(models, "deepseek_v3"), the_matrix, capabilities)
    assert deepseek_v3["engine"] is None
    falcon = model_support.find(models, "RefinedWebModel")
    assert falcon.model_type == "falcon" and falcon.converter_dir("models") == "examples/models/contrib/falcon"


def test_models_json_lists_the_supported_tags_and_every_model(real):
    the_matrix, capabilities, models = real
    data = json.loads(model_support.models_json(models, the_matrix, capabilities))
    assert data["tags"] == [e.tag for e in the_matrix.supported()]
    assert [m["model_type"] for m in data["models"]] == [m.model_type for m in models]


def test_image_matrix_json_is_the_matrix_plus_capabilities(real):
    the_matrix, capabilities, _ = real
    entries = json.loads(image_matrix_json(the_matrix, capabilities))
    assert [{k: v for k, v in e.items() if k != "capabilities"} for e in entries] == [
        e.to_dict() for e in the_matrix.entries
    ]
    assert entries[-1]["capabilities"] == capabilities.of(the_matrix.entries[-1]).to_dict()


def test_unknown_names_list_the_known_ones(real):
    with pytest.raises(UsageError, match="no model_type or architecture 'Nope'") as caught:
        model_support.find(real[2], "Nope")
    assert "phi3" in caught.value.hint


# --- validation ----------------------------------------------------------------------------------------------------


def write(tmp_path, name: str, data) -> object:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def real_yaml(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda d: d["features"]["engine_build"].update(since="0.9"), None),
        (
            lambda d: d["features"]["engine_build"].update(since="nine"),
            "features.engine_build.since: expected a quoted",
        ),
        (lambda d: d["features"]["engine_build"].update(after="1.0.0"), "features.engine_build.after: unknown key"),
        (lambda d: d["flags"]["trtllm-build"].update(max_seq_len={}), "a flag starts with --"),
        (lambda d: d["flags"].update(nvcc={}), "flags.nvcc: unknown program; allowed: trtllm-build"),
        (lambda d: d["examples_layout"].pop("flat"), "expected exactly the layouts flat, models"),
        (lambda d: d.pop("flags"), "top level: expected the keys features, examples_layout, flags"),
    ],
)
def test_capabilities_validation_names_the_field(tmp_path, change, words):
    data = copy.deepcopy(real_yaml("capabilities.yaml"))
    change(data)
    path = write(tmp_path, "capabilities.yaml", data)
    if words is None:
        load_capabilities(path)
        return
    with pytest.raises(UsageError) as caught:
        load_capabilities(path)
    assert words in caught.value.message and str(path) in caught.value.message


def test_overlapping_layout_rules_are_refused_when_applied(tmp_path, real):
    data = copy.deepcopy(real_yaml("capabilities.yaml"))
    data["examples_layout"]["flat"] = {}
    capabilities = load_capabilities(write(tmp_path, "capabilities.yaml", data))
    with pytest.raises(UsageError, match=r"examples_layout gives \['flat', 'models'\] for tag 25.06"):
        capabilities.of(real[0].get("25.06"))


def model(**changes) -> dict:
    data = {
        "model_type": "x",
        "architectures": ["XForCausalLM"],
        "engine": {"since": "0.9.0", "folder": {"flat": "x", "models": "core/x"}},
        "llmapi": None,
        "sources": ["test"],
    }
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "models,words",
    [
        ([model()], None),
        ([model(engine=None)], "engine and llmapi are both null"),
        ([model(colour="red")], "model x: colour: unknown key"),
        ([{k: v for k, v in model().items() if k != "sources"}], "model x: sources: missing key"),
        ([model(engine={"since": "0.9.0", "folder": {"flat": "x"}})], "folder: expected a relative folder for each"),
        ([model(engine={"since": "0.9.0", "folder": {"flat": "x", "models": "x"}})], "expected core/<dir> or contrib"),
        ([model(engine={"folder": {"flat": "x", "models": "core/x"}})], "engine.since: missing"),
        ([model(llmapi={"since": "0.19"})], None),
        ([model(llmapi={"from": "0.19.0"})], "llmapi: expected null or {since: VERSION}"),
        ([model(uncertain={"engine": ""})], "uncertain.engine: expected one of engine, engine.args, llmapi"),
        ([model(), model(model_type="y", aliases=["x"])], "model y: 'x' is already a name of model x"),
        (
            [
                model(
                    engine={
                        "since": "0.9.0",
                        "folder": {"flat": "x", "models": "core/x"},
                        "args": [{"args": ["--a", "b"], "sine": "0.10.0"}],
                    }
                )
            ],
            "args[0].sine: unknown key",
        ),
    ],
)
def test_models_validation_names_the_model_and_the_field(tmp_path, models, words):
    path = write(tmp_path, "models.yaml", {"models": models})
    if words is None:
        assert model_support.load_models(path)[0].model_type == "x"
        return
    with pytest.raises(UsageError) as caught:
        model_support.load_models(path)
    assert words in caught.value.message and str(path) in caught.value.message


def test_missing_data_file_is_one_usage_error(tmp_path):
    with pytest.raises(UsageError, match="models file .* does not exist"):
        model_support.load_models(tmp_path / "models.yaml")


@pytest.mark.parametrize("templates,tag", TEMPLATE_SETS)
def test_guided_decoding_is_named_exactly_where_upstreams_templates_declare_its_inputs(real, templates, tag):
    """The capability is the templates' own word: the engine models declare both guide inputs and the tensorrt_llm
    model the three parameters from v0.19.0 (25.05) on, the llmapi model never."""
    root = templates_for(templates)
    engine = root / "inflight_batcher_llm" if (root / "inflight_batcher_llm").is_dir() else root
    declared = set()
    for model in ("tensorrt_llm", "ensemble"):
        text = (engine / model / "config.pbtxt").read_text()
        declared.add(all(f'name: "{name}"' in text for name in ("guided_decoding_guide_type", "guided_decoding_guide")))
    parameters = ("guided_decoding_backend", "xgrammar_tokenizer_info_path", "tokenizer_dir")
    declared.add(all(f"${{{p}}}" in (engine / "tensorrt_llm" / "config.pbtxt").read_text() for p in parameters))
    assert declared == {"guided_decoding" in caps(real, tag).features}
    llmapi = root / "llmapi" / "tensorrt_llm" / "config.pbtxt"
    if llmapi.is_file():
        assert "guided_decoding_guide" not in llmapi.read_text()
