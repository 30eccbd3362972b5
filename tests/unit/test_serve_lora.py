"""LORA_DIR through the entrypoint as a process (`prepare`), with the NVIDIA programs played by tests/doubles and
upstream's v0.19.0 templates: the engine built with the adapters' LoRA flags (recorded by the build double), each
adapter converted into the prefetch layout in the cache (checked file by file), the tensorrt_llm model filled to load
it, the front told the task ids; refusals with one line each, before anything is downloaded, built or written."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from harness.image import Image, records, templates_for
from harness.tiny_adapter import tiny_lora
from trtllm_entrypoint.model import adapter_set
from trtllm_entrypoint.model.digest import content_digest

pytestmark = pytest.mark.process


@pytest.fixture
def img(tmp_path):
    return Image(tmp_path, "25.05", templates_for("v0.19.0"))


def prepare(img: Image, **env: str):
    return img.run("prepare", **{"WORKFLOW": "engine", "FRONTEND": "openai", **env})


def parameter(config: str, key: str) -> str:
    found = re.search(r'key:\s*"' + key + r'"\s*value:\s*{\s*string_value:\s*"([^"]*)"', config)
    assert found, key
    return found.group(1)


def test_adapters_are_built_into_the_engine_converted_into_the_cache_and_loaded_by_the_model(img, tmp_path):
    loras = tmp_path / "loras"
    tiny_lora(loras / "sql", rank=4, modules=("q_proj", "v_proj"))
    tiny_lora(loras / "chat", rank=8, modules=("q_proj", "down_proj"), fill=1)
    result = prepare(img, LORA_DIR=str(loras))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)

    # trtllm-build got the LoRA flags the adapters need, and only them
    (build,) = records(img.records, "trtllm-build")
    argv = build["argv"]
    assert argv[argv.index("--lora_plugin") :][:7] == [
        "--lora_plugin", "float16", "--lora_target_modules", "attn_q", "attn_v", "mlp_4h_to_h", "--max_lora_rank",
    ]  # fmt: skip
    assert argv[argv.index("--max_lora_rank") + 1] == "8"
    # each adapter converted once by the image's hf_lora_convert.py, into its task id's folder
    converted = records(img.records, "hf_lora_convert")
    assert sorted(c["argv"][c["argv"].index("--in-file") + 1] for c in converted) == sorted(
        str(loras / name) for name in ("sql", "chat")
    )
    ids = out["front"]["plan"]["adapters"]  # what every worker of the front is told
    assert set(ids) == {"sql", "chat"} and all(1 <= i < 2**31 for i in ids.values())
    config = (img.repo / "tensorrt_llm" / "config.pbtxt").read_text()
    prefetch = img.cache / "adapters" / parameter(config, "lora_prefetch_dir").rsplit("/", 1)[-1]
    assert parameter(config, "lora_prefetch_dir") == str(prefetch)
    assert (
        parameter(config, "lora_cache_max_adapter_size") == parameter(config, "lora_cache_optimal_adapter_size") == "8"
    )
    assert int(parameter(config, "lora_cache_host_memory_bytes")) >= 1 << 30
    # the prefetch layout, file by file: <task id>/model.lora_{weights,config}.npy and nothing else but the stamp
    assert sorted(p.name for p in prefetch.iterdir()) == sorted([*map(str, ids.values()), "convert.log", "stamp.json"])
    for name, task in ids.items():
        folder = prefetch / str(task)
        assert sorted(p.name for p in folder.iterdir()) == ["model.lora_config.npy", "model.lora_weights.npy"]
        table = np.load(folder / "model.lora_config.npy")
        weights = np.load(folder / "model.lora_weights.npy")
        rows = 2  # one layer, two modules each
        assert table.shape == (1, rows, 3) and weights.shape[:2] == (1, rows) and weights.dtype == np.float16
        assert set(table[0, :, 2]) == {4 if name == "sql" else 8}
    assert "adapter served" in result.stderr and "task_id" in result.stderr


def test_a_second_start_with_an_adapter_of_the_same_shape_reuses_the_engine(img, tmp_path):
    loras = tmp_path / "loras"
    tiny_lora(loras / "sql", rank=8, modules=("q_proj", "v_proj"))
    assert prepare(img, LORA_DIR=str(loras)).returncode == 0
    tiny_lora(loras / "more", rank=4, modules=("v_proj",), fill=2)  # within the rank and modules built for
    again = prepare(img, LORA_DIR=str(loras))
    assert again.returncode == 0, again.stderr
    assert img.builds() == 1  # the engine key holds only the three LoRA flags
    assert len(records(img.records, "hf_lora_convert")) == 3  # a new set: converted again, both adapters
    tiny_lora(loras / "wide", rank=16, modules=("q_proj",), fill=3)  # a larger rank needs another engine
    assert prepare(img, LORA_DIR=str(loras)).returncode == 0
    assert img.builds() == 2


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: tiny_lora(d / "big", scale=2), "adapter 'big' is for another base model"),
        (lambda d: tiny_lora(d / "deep", rank=128), "adapter 'deep' has rank 128, above LORA_MAX_RANK=64"),
        (lambda d: (tiny_lora(d / "a"), (d / "a" / "adapter_model.safetensors").write_bytes(b"\x08" + bytes(20))),
         "adapter 'a' has a corrupt adapter_model.safetensors"),
        (lambda d: (tiny_lora(d / "Sql"), tiny_lora(d / "sql")), "have one name"),
        (lambda d: tiny_lora(d / "ensemble"), "adapter 'ensemble' has the name of 'ensemble'"),
        (lambda d: tiny_lora(d / "Tiny"), "adapter 'Tiny' has the name of 'tiny'"),  # the front's name for the base
    ],
)  # fmt: skip
def test_bad_adapters_are_refused_with_one_line_before_anything_is_built(img, tmp_path, make, expected):
    loras = tmp_path / "loras"
    loras.mkdir()
    make(loras)
    result = prepare(img, LORA_DIR=str(loras))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert img.builds() == 0 and not records(img.records, "hf_lora_convert") and not img.repo.exists()


@pytest.mark.parametrize(
    ("tag", "templates", "env"), [("25.01", "v0.17.0", {}), ("26.07", "triton_backend", {"WORKFLOW": "llmapi"})]
)
def test_a_tag_or_workflow_without_adapters_refuses_lora_dir_naming_the_first_tag_that_can(
    tmp_path, tag, templates, env
):
    img = Image(tmp_path, tag, templates_for(templates))
    tiny_lora(tmp_path / "loras" / "sql")
    result = img.run("prepare", **{"WORKFLOW": "engine", "LORA_DIR": str(tmp_path / "loras"), **env})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "adapters need WORKFLOW=engine on tag 25.05 or later" in lines[0], result.stderr
    assert img.builds() == 0 and not (img.cache / "models").exists()


def test_the_task_ids_follow_the_adapters_not_the_start(img, tmp_path):
    tiny_lora(tmp_path / "loras" / "sql")
    first = json.loads(prepare(img, LORA_DIR=str(tmp_path / "loras")).stdout)
    second = json.loads(prepare(img, LORA_DIR=str(tmp_path / "loras")).stdout)
    front = [out["front"]["plan"]["adapters"] for out in (first, second)]
    assert front[0] == front[1] == {"sql": adapter_set.task_id("sql", content_digest(tmp_path / "loras" / "sql", None))}


def test_check_lists_each_adapter_with_its_task_id_and_names_a_bad_one(img, tmp_path):
    loras = tmp_path / "loras"
    tiny_lora(loras / "sql")
    served = json.loads(prepare(img, LORA_DIR=str(loras)).stdout)["front"]["plan"]["adapters"]
    report = img.run("check", WORKFLOW="engine", LORA_DIR=str(loras))
    assert json.loads(report.stdout)["adapters"]["task_ids"] == served  # what a start serves
    tiny_lora(loras / "wide", scale=2)
    refused = img.run("check", WORKFLOW="engine", LORA_DIR=str(loras))
    assert refused.returncode == 1 and "adapter 'wide' is for another base model" in refused.stderr
