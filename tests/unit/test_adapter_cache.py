"""Converting adapters into the prefetch layout in the cache (adapter_cache.py), with TensorRT-LLM's converter played
by tests/doubles/hf_lora_convert_double.py: the layout the backend loads, file by file, converted once per set."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest

from harness.doubles import DOUBLES_DIR, read_records, write_wrapper
from harness.tiny_adapter import tiny_lora
from trtllm_entrypoint.engine import adapter_cache
from trtllm_entrypoint.errors import EntrypointError
from trtllm_entrypoint.log import Log
from trtllm_entrypoint.model import adapter_set, adapters

pytestmark = pytest.mark.process


@pytest.fixture
def script(tmp_path):
    return write_wrapper(
        tmp_path / "app" / "examples" / "hf_lora_convert.py", str(DOUBLES_DIR / "hf_lora_convert_double.py")
    )


def served(tmp_path, *specs):
    out = []
    for name, rank, modules in specs:
        adapter = adapters.read_adapter(tiny_lora(tmp_path / "loras" / name, rank=rank, modules=modules), name, 64)
        out.append(replace(adapter, digest=name * 8))
    return adapter_set.with_task_ids(out)


def ensure(found, script, tmp_path, monkeypatch, stream=None):
    monkeypatch.setenv("DOUBLE_RECORD_DIR", str(tmp_path / "records"))
    return adapter_cache.ensure(
        found,
        storage="float16",
        tensorrt_llm="0.19.0",
        script=script,
        cache_dir=tmp_path / "cache",
        log=Log(stream=stream or io.StringIO()),
        environ={"PATH": "/usr/bin:/bin", "DOUBLE_RECORD_DIR": str(tmp_path / "records")},
        timeout_s=10,
    )


def test_the_adapters_are_converted_into_the_layout_the_backend_loads(tmp_path, script, monkeypatch):
    found = served(tmp_path, ("sql", 4, ("q_proj", "v_proj")), ("chat", 8, ("q_proj", "k_proj", "down_proj")))
    entry = ensure(found, script, tmp_path, monkeypatch)
    assert entry.parent == tmp_path / "cache" / "adapters"
    folders = sorted(p.name for p in entry.iterdir() if p.is_dir())
    assert folders == sorted(str(a.task_id) for a in found) and all(f.isdigit() for f in folders)
    for adapter in found:
        folder = entry / str(adapter.task_id)
        assert sorted(p.name for p in folder.iterdir()) == ["model.lora_config.npy", "model.lora_weights.npy"]
        config = np.load(folder / "model.lora_config.npy")
        weights = np.load(folder / "model.lora_weights.npy")
        assert config.dtype == np.int32 and config.shape == (1, adapter.rows, 3)
        assert weights.dtype == np.float16 and weights.shape == (1, adapter.rows, adapter.row_elements)
        assert set(config[0, :, 2]) == {adapter.rank}  # the rank column
        # each row names TensorRT-LLM's module id of one adapted module (LoraManager.LORA_MODULE_IDS)
        ids = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "down_proj": 6}
        assert sorted(config[0, :, 0]) == sorted(ids[m] for m in adapter.modules)
    stamp = json.loads((entry / "stamp.json").read_text())
    assert stamp["adapters"] == {a.name: {"task_id": a.task_id, "digest": a.digest} for a in found}
    calls = read_records(tmp_path / "records", "hf_lora_convert")
    assert sorted(c["argv"][c["argv"].index("--in-file") + 1] for c in calls) == sorted(str(a.path) for a in found)
    assert all(c["argv"][c["argv"].index("--storage-type") + 1] == "float16" for c in calls)


def test_the_same_set_is_converted_once(tmp_path, script, monkeypatch):
    found = served(tmp_path, ("sql", 4, ("q_proj",)))
    first = ensure(found, script, tmp_path, monkeypatch)
    stream = io.StringIO()
    assert ensure(found, script, tmp_path, monkeypatch, stream) == first
    assert "adapters cache hit" in stream.getvalue()
    assert len(read_records(tmp_path / "records", "hf_lora_convert")) == 1


def test_a_damaged_entry_is_converted_again(tmp_path, script, monkeypatch):
    found = served(tmp_path, ("sql", 4, ("q_proj",)))
    entry = ensure(found, script, tmp_path, monkeypatch)
    (entry / str(found[0].task_id) / "model.lora_config.npy").chmod(0o644)
    (entry / str(found[0].task_id) / "model.lora_config.npy").write_bytes(b"\x93NUMPY")
    again = ensure(found, script, tmp_path, monkeypatch)
    assert adapter_cache.entry_problem(again, adapter_set.set_key(found, "float16", "0.19.0"), found) is None
    assert len(read_records(tmp_path / "records", "hf_lora_convert")) == 2


def test_a_converter_that_drops_modules_is_caught_before_publishing(tmp_path, script, monkeypatch):
    found = served(tmp_path, ("sql", 4, ("q_proj", "v_proj")))
    lying = [replace(found[0], rows=found[0].rows + 1)]  # expects one more (layer, module) than the file has
    with pytest.raises(EntrypointError, match="not what the backend loads: .* the converter dropped some"):
        ensure(lying, script, tmp_path, monkeypatch)
    assert not [p for p in (tmp_path / "cache" / "adapters").iterdir() if p.is_dir()]
