"""The engine workflow's requests straight to the tensorrt_llm model (openai/engine.py), against the inputs upstream's
own tensorrt_llm config.pbtxt declares in every stored release."""

from __future__ import annotations

import re

import pytest

from harness.image import TEMPLATE_SETS, templates_for
from trtllm_entrypoint.openai import engine
from trtllm_entrypoint.repository import pbtxt


def declared_inputs(templates: str) -> frozenset[str]:
    path = templates_for(templates) / "inflight_batcher_llm" / "tensorrt_llm" / "config.pbtxt"
    filled = re.sub(r"\$\{\w+\}", "1", path.read_text())  # the template's placeholders, as a fill would
    return frozenset(pbtxt.names(pbtxt.parse(filled, str(path)).get("input")))


@pytest.mark.parametrize("templates", [name for name, _ in TEMPLATE_SETS])
def test_every_release_declares_what_the_ids_path_sends(templates: str) -> None:
    declared = declared_inputs(templates)
    base = {"input_ids": "", "request_output_len": 8, "streaming": True, "temperature": 0.5, "runtime_top_k": 3}
    body = engine.ids_body(declared, base, [1, 5, 9], end_id=2, pad_id=0)
    assert set(body) <= declared and {"input_ids", "input_lengths", "request_output_len", "streaming"} <= set(body)
    assert body["input_ids"] == [1, 5, 9] and body["input_lengths"] == 3 and body["request_output_len"] == 8
    assert (body["end_id"], body["pad_id"], body["runtime_top_k"]) == (2, 0, 3)
    # the seed's input was renamed in TensorRT-LLM's own templates; both are found
    assert engine.input_name(declared, "seed") == ("seed" if templates == "triton_backend" else "random_seed")
    assert engine.input_name(declared, "min_tokens") in {"min_length", "min_tokens"}
    if templates == "v0.7.0":  # frequency_penalty came with v0.8.0
        assert engine.input_name(declared, "frequency_penalty") is None


def test_output_ids_read_as_the_generate_endpoint_writes_them() -> None:
    assert engine.output_ids({"output_ids": 7}) == [7]
    assert engine.output_ids({"output_ids": [[7, 8]]}) == [7, 8]
    assert engine.output_ids({}) == []
    assert engine.output_logprobs({"output_log_probs": [[-0.5]]}) == [-0.5]
