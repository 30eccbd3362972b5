"""FrontPlan (openai/plan.py): the one value the entrypoint hands every worker, read back field for field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trtllm_entrypoint.openai.plan import FrontPlan

PLAN = FrontPlan(
    host="0.0.0.0", port=9000, workers=4, triton_url="http://127.0.0.1:8000", served_name="served",
    entry_model="ensemble", workflow="llmapi", config="/repo/ensemble/config.pbtxt", tokenizer="/models/x",
    restricted=("inference", "metadata"), max_seq_len=4096, shutdown_timeout=30.0, max_generations=256,
)  # fmt: skip


def test_the_plan_reads_back_as_it_was_written():
    assert FrontPlan.from_json(PLAN.to_json()) == PLAN
    assert isinstance(FrontPlan.from_json(PLAN.to_json()).restricted, tuple)


@pytest.mark.parametrize("change", [{"drop": "tokenizer"}, {"add": "extra"}])
def test_a_plan_with_missing_or_unknown_fields_is_refused_naming_them(change):
    data = dataclasses.asdict(PLAN)
    if "drop" in change:
        del data[change["drop"]]
    else:
        data[change["add"]] = 1
    with pytest.raises(ValueError, match=r"front plan fields differ: missing \[.*\], unknown \[.*\]") as refused:
        FrontPlan.from_json(json.dumps(data))
    assert next(iter(change.values())) in str(refused.value)
