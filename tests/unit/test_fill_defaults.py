"""The parameters we fill with the backend's own default (parameters.BACKEND_DEFAULTS) hold the value upstream's
Python models fall back to, in every stored template set that has the placeholder: read from each set's model.py."""

from __future__ import annotations

import re

import pytest

from harness.image import TEMPLATE_SETS, templates_for
from trtllm_entrypoint.repository import fill, parameters

# The fallback each model.py states in the warning it prints for a value it cannot parse.
FALLBACK = r"Don't setup '{name}' correctly \(set value is [^)]*\)\. Set it as (True|False) by default"


@pytest.mark.parametrize("templates", [name for name, _ in TEMPLATE_SETS])
def test_each_filled_default_is_the_one_upstreams_model_falls_back_to(templates):
    root = templates_for(templates)
    checked = []
    for config in sorted(root.glob("inflight_batcher_llm/*/config.pbtxt")):
        for name in sorted(fill.placeholders(config.read_text()) & set(parameters.BACKEND_DEFAULTS)):
            model = config.parent / "1" / "model.py"
            if not model.exists():  # the TensorRT-LLM >= 0.20 snapshot stores templates only
                continue
            stated = re.findall(FALLBACK.format(name=name), model.read_text())
            assert stated, f"{model} no longer states its fallback for {name}: read it again"
            assert {value.lower() for value in stated} == {parameters.BACKEND_DEFAULTS[name]}, (model, name, stated)
            checked.append(name)
    has_models = any(root.glob("inflight_batcher_llm/*/1/model.py"))
    has_placeholders = any(
        set(parameters.BACKEND_DEFAULTS) & fill.placeholders(c.read_text())
        for c in root.glob("inflight_batcher_llm/*/*.pbtxt")
    )
    assert checked or not (has_models and has_placeholders), templates
    print(f"{templates}: {sorted(set(checked)) or 'no placeholder with a stored model.py'}")
