"""docs/openai.md names what each workflow sends: the extension table's inputs are the ones sampling.py maps each
extension to (the engine workflow asks the `tensorrt_llm` model itself: runtime_top_k, len_penalty, not the
ensemble's top_k, length_penalty), "refused" exactly where the served model declares none of them, and `stop` is
said to be the front's own cut for the engine workflow (no stop input is sent there)."""

from __future__ import annotations

import re
from pathlib import Path

from harness.upstream_files import upstream_path
from trtllm_entrypoint.openai import engine, sampling

DOC = Path(__file__).parents[3] / "docs" / "openai.md"
OPENAI_SAMPLING = {"temperature", "top_p", "presence_penalty", "frequency_penalty"}
EXTENSIONS = set(sampling.SAMPLING_FIELDS) - OPENAI_SAMPLING
LLMAPI_CONFIG = "tensorrt_llm/triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt"


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def extension_rows() -> dict[str, tuple[str, str]]:
    """The extension table's rows: extension -> (engine workflow's cell, llmapi's cell)."""
    section = DOC.read_text(encoding="utf-8").split("\nExtensions (not OpenAI's", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[names(cells[0])[0]] = (cells[1], cells[2])
    return rows


def test_the_extension_table_names_the_inputs_each_workflow_sends() -> None:
    rows = extension_rows()
    assert set(rows) == EXTENSIONS
    for extension, (engine_cell, _) in rows.items():
        sent = list(engine.ENGINE_INPUTS.get(extension, ()))
        assert names(engine_cell) == sent, f"{extension}: the engine workflow sends {sent or 'nothing'}"
        assert ("refused" in engine_cell) == (not sent), extension


def test_the_extension_table_says_which_llmapi_inputs_upstreams_model_declares() -> None:
    config = upstream_path(LLMAPI_CONFIG)
    declared = sampling.Model.from_config("m", "llmapi", config.read_text(), str(config)).inputs
    for extension, (_, llmapi_cell) in extension_rows().items():
        mapped = list(sampling.INPUT_NAMES["llmapi"].get(extension, ()))
        assert names(llmapi_cell) == mapped, extension
        assert ("refused" in llmapi_cell) == (not declared & set(mapped)), extension


def test_stop_is_documented_as_the_front_cuts_it_on_both_workflows() -> None:
    """The stop bullet names as the model's stop inputs exactly those sent: none (the front cuts stops on the text
    and closes the stream, for the engine workflow's tensorrt_llm model and for llmapi alike)."""
    bullet = re.search(r"^- `stop` .*?(?=^- )", DOC.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert bullet is not None
    sent = set(engine.ENGINE_INPUTS.get("stop", ())) | set(sampling.INPUT_NAMES["llmapi"].get("stop", ()))
    assert {n for n in names(bullet.group(0)) if n.startswith(("stop_", "sampling_param_"))} == sent
    assert "front" in bullet.group(0) and "leaves the stream" in bullet.group(0)
