"""LoRA adapters (model/adapters.py): reading and checking PEFT adapters against the base, their names and task ids, and
what the engine build and the tensorrt_llm model get from them."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import numpy as np
import pytest
from safetensors.numpy import save_file

from harness.tiny_adapter import tiny_lora
from harness.tiny_checkpoint import tiny_llama
from trtllm_entrypoint.errors import UsageError
from trtllm_entrypoint.model import adapter_set, adapters


@pytest.fixture
def base(tmp_path):
    config = json.loads((tiny_llama(tmp_path / "base") / "config.json").read_text())
    return adapters.Base.from_config(config, "org/tiny-llama")


def read(path, max_rank=64):
    return adapters.read_adapter(path, path.name, max_rank)


def one_line(exc: pytest.ExceptionInfo[UsageError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and exc.value.exit_code == 2
    return text


def test_a_peft_adapter_is_read_with_its_modules_rank_and_size(tmp_path, base):
    path = tiny_lora(tmp_path / "sql", rank=4, modules=("q_proj", "v_proj", "down_proj"), layers=1)
    adapter = read(path)
    adapters.check_fits(adapter, base)
    assert (adapter.name, adapter.rank, adapter.alpha) == ("sql", 4, 8.0)
    assert adapter.modules == {"q_proj", "v_proj", "down_proj"}
    assert adapter.target_modules == {"attn_q", "attn_v", "mlp_4h_to_h"}
    # one row per (layer, module); the longest is down_proj's: A 4x32 + B 16x4
    assert (adapter.rows, adapter.row_elements) == (3, 4 * 32 + 16 * 4)
    assert adapter.converted_bytes("bfloat16") == 3 * 192 * 2


def test_a_file_written_by_the_safetensors_library_reads_the_same(tmp_path):
    path = tiny_lora(tmp_path / "a", rank=2, modules=("k_proj",))
    ours = read(path)
    prefix = "base_model.model.model.layers.0.self_attn.k_proj"
    save_file(
        {
            f"{prefix}.lora_A.weight": np.zeros((2, 16), np.float16),
            f"{prefix}.lora_B.weight": np.ones((16, 2), np.float32),
        },
        str(path / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    theirs = read(path)
    assert (theirs.rows, theirs.row_elements, theirs.modules) == (ours.rows, ours.row_elements, ours.modules)


def corrupt(path, how: str) -> None:
    file = path / "adapter_model.safetensors"
    raw = file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    if how == "truncated":
        file.write_bytes(raw[:-3])
    elif how == "short":
        file.write_bytes(raw[:5])
    elif how == "huge header":
        file.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])
    elif how == "not json":
        file.write_bytes(raw[:8] + b"{" * length + raw[8 + length :])
    else:  # "gap": a tensor's range moved past its neighbour's end
        key = next(k for k in header if k.endswith("lora_A.weight"))
        begin, end = header[key]["data_offsets"]
        header[key]["data_offsets"] = [begin + 2, end + 2]
        text = json.dumps(header).encode()
        file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


@pytest.mark.parametrize("how", ["truncated", "short", "huge header", "not json", "gap"])
def test_a_corrupt_safetensors_file_is_one_clear_line(tmp_path, how):
    path = tiny_lora(tmp_path / "broken")
    corrupt(path, how)
    with pytest.raises(UsageError) as exc:
        read(path)
    assert "adapter 'broken' has a corrupt adapter_model.safetensors" in one_line(exc)


def test_an_adapter_for_another_base_is_refused_by_its_sizes(tmp_path, base):
    wide = read(tiny_lora(tmp_path / "wide", scale=2))
    with pytest.raises(UsageError) as exc:
        adapters.check_fits(wide, base)
    assert "adapter 'wide' is for another base model: its layer 0 q_proj maps 32 -> 32" in one_line(exc)
    deep = read(tiny_lora(tmp_path / "deep", layers=3))
    with pytest.raises(UsageError, match="changes layer 1; the base model has 1 layers"):
        adapters.check_fits(deep, base)


def test_an_adapter_naming_another_hub_base_is_refused(tmp_path, base):
    other = read(tiny_lora(tmp_path / "other", base_model="org/other-model"))
    with pytest.raises(UsageError) as exc:
        adapters.check_fits(other, base)
    assert "is for base model 'org/other-model', not 'org/tiny-llama'" in one_line(exc)
    # the same base under other letter case, or a local path the adapter was trained from, is fine
    adapters.check_fits(read(tiny_lora(tmp_path / "same", base_model="Org/Tiny-Llama")), base)
    adapters.check_fits(read(tiny_lora(tmp_path / "local", base_model="/data/tiny-llama")), base)


def test_a_rank_above_the_limit_is_refused(tmp_path):
    with pytest.raises(UsageError) as exc:
        read(tiny_lora(tmp_path / "big", rank=16), max_rank=8)
    assert "adapter 'big' has rank 16, above LORA_MAX_RANK=8" in one_line(exc)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"use_dora": True}, "uses DoRA"),
        ({"modules_to_save": ["lm_head"]}, "uses modules_to_save"),
        ({"rank_pattern": {"q_proj": 8}}, "uses per-module ranks"),
        ({"peft_type": "IA3"}, "is a IA3 adapter"),
        ({"r": 0}, "has r=0"),
        ({"lora_alpha": "x"}, "has lora_alpha='x'"),
    ],
)
def test_what_the_backend_cannot_serve_is_named(tmp_path, change, expected):
    path = tiny_lora(tmp_path / "odd")
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UsageError) as exc:
        read(path)
    assert expected in one_line(exc)


def test_tensors_the_converter_would_drop_are_refused(tmp_path):
    path = tiny_lora(tmp_path / "extra")
    raw = (path / "adapter_model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header["base_model.model.lm_head.weight"] = {"dtype": "F16", "shape": [0], "data_offsets": [0, 0]}
    text = json.dumps(header).encode()
    (path / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])
    with pytest.raises(UsageError, match="has tensor 'base_model.model.lm_head.weight', which TensorRT-LLM"):
        read(path)


def test_a_pickled_adapter_is_refused_without_loading_it(tmp_path):
    path = tiny_lora(tmp_path / "pickled")
    (path / "adapter_model.safetensors").rename(path / "adapter_model.bin")
    with pytest.raises(UsageError, match="adapter_model.bin \\(a pickle"):
        read(path)


def test_the_directory_gives_names_and_refuses_two_adapters_with_one_name(tmp_path):
    root = tmp_path / "loras"
    tiny_lora(root / "b-sql")
    tiny_lora(root / "a.chat")
    (root / ".cache").mkdir()
    (root / "README.md").write_text("not an adapter")
    assert [name for name, _ in adapter_set.adapter_dirs(root)] == ["a.chat", "b-sql"]
    tiny_lora(root / "B-SQL")
    with pytest.raises(UsageError) as exc:
        adapter_set.adapter_dirs(root)
    assert "and 'B-SQL' have one name" in one_line(exc) or "and 'b-sql' have one name" in one_line(exc)
    with pytest.raises(UsageError, match="does not exist"):
        adapter_set.adapter_dirs(tmp_path / "missing")


def test_an_adapter_may_not_take_a_name_the_server_serves(tmp_path):
    adapter = read(tiny_lora(tmp_path / "Ensemble"))
    with pytest.raises(UsageError, match="has the name of 'ensemble'"):
        adapter_set.check_names([adapter], ["llama", "ensemble", "tensorrt_llm"])


def test_task_ids_are_stable_in_the_backends_range_and_follow_name_and_content():
    first = adapter_set.task_id("sql", "d" * 64)
    assert first == adapter_set.task_id("sql", "d" * 64)
    assert 1 <= first <= adapters.TASK_ID_MAX == 2**31 - 1
    assert len({first, adapter_set.task_id("chat", "d" * 64), adapter_set.task_id("sql", "e" * 64)}) == 3


def test_two_adapters_that_draw_one_task_id_are_refused(tmp_path, monkeypatch):
    a = replace(read(tiny_lora(tmp_path / "a")), digest="1")
    b = replace(read(tiny_lora(tmp_path / "b")), digest="2")
    assert len({x.task_id for x in adapter_set.with_task_ids([a, b])}) == 2
    monkeypatch.setattr(adapter_set, "task_id", lambda name, digest: 7)
    with pytest.raises(UsageError, match="drew the same task id 7"):
        adapter_set.with_task_ids([a, b])


def test_the_build_flags_cover_every_adapter_and_stay_for_one_of_the_same_shape(tmp_path):
    sql = read(tiny_lora(tmp_path / "sql", rank=4, modules=("q_proj", "v_proj")))
    chat = read(tiny_lora(tmp_path / "chat", rank=8, modules=("q_proj", "o_proj")))
    build = adapter_set.lora_build([sql, chat], "float16")
    assert build.argv() == [
        "--lora_plugin", "float16", "--lora_target_modules", "attn_dense", "attn_q", "attn_v", "--max_lora_rank", "8",
    ]  # fmt: skip
    same_shape = read(tiny_lora(tmp_path / "more", rank=8, modules=("v_proj",), fill=3))
    assert adapter_set.lora_build([sql, chat, same_shape], "float16") == build


def test_the_models_lora_parameters_hold_every_adapter(tmp_path):
    sql = read(tiny_lora(tmp_path / "sql", rank=4))
    chat = read(tiny_lora(tmp_path / "chat", rank=8))
    params = adapter_set.cache_parameters([sql, chat], "float16", tmp_path / "prefetch")
    assert params == {
        "lora_prefetch_dir": str(tmp_path / "prefetch"),
        "lora_cache_max_adapter_size": "8",
        "lora_cache_optimal_adapter_size": "8",
        "lora_cache_host_memory_bytes": str(1 << 30),
    }


def test_the_storage_dtype_is_the_engines():
    assert adapter_set.storage_dtype("bfloat16", {"torch_dtype": "float16"}) == "bfloat16"
    assert adapter_set.storage_dtype("auto", {"torch_dtype": "bfloat16"}) == "bfloat16"
    assert adapter_set.storage_dtype("auto", {}) == "float16"


def test_the_prefetch_key_follows_content_names_and_converter(tmp_path):
    a = replace(read(tiny_lora(tmp_path / "a")), digest="1", task_id=5)
    key = adapter_set.set_key([a], "float16", "0.19.0")
    assert key == adapter_set.set_key([a], "float16", "0.19.0")
    assert key != adapter_set.set_key([replace(a, digest="2")], "float16", "0.19.0")
    assert key != adapter_set.set_key([a], "bfloat16", "0.19.0")
    assert key != adapter_set.set_key([a], "float16", "0.20.0")


def test_lora_dir_is_refused_where_adapters_cannot_be_served_naming_the_first_tag_that_can():
    adapters.check_servable("engine", ["lora_prefetch", "engine_build"], "25.05", "25.05")
    with pytest.raises(UsageError) as exc:
        adapters.check_servable("engine", ["engine_build"], "25.01", "25.05")
    assert "image 25.01's backend cannot load adapters" in one_line(exc) and "WORKFLOW=engine on tag 25.05" in str(
        exc.value
    )
    with pytest.raises(UsageError) as exc:
        adapters.check_servable("llmapi", ["lora_prefetch"], "26.07", "25.05")
    assert "WORKFLOW=llmapi takes no per-request adapter" in one_line(exc)


def test_a_prebuilt_engine_must_have_been_built_for_the_adapters(tmp_path):
    needed = adapter_set.LoraBuild("float16", ("attn_q", "attn_v"), 8)
    fits = {
        "plugin_config": {"lora_plugin": "float16"},
        "lora_config": {"lora_target_modules": ["attn_q", "attn_k", "attn_v"], "max_lora_rank": 16},
    }
    adapter_set.check_prebuilt(fits, needed, tmp_path)
    cases = [
        ({"plugin_config": {"lora_plugin": None}}, "was built without the LoRA plugin"),
        ({**fits, "lora_config": {"lora_target_modules": ["attn_q"], "max_lora_rank": 16}}, "also change attn_v"),
        (
            {**fits, "lora_config": {"lora_target_modules": ["attn_q", "attn_v"], "max_lora_rank": 4}},
            "--max_lora_rank 4",
        ),
    ]
    for build_config, expected in cases:
        with pytest.raises(UsageError) as exc:
            adapter_set.check_prebuilt(build_config, needed, tmp_path)
        assert expected in one_line(exc) and "--lora_plugin float16" in str(exc.value)
