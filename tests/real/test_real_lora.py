"""LoRA adapters on the REAL tritonserver 2.51 with upstream's v0.19.0 templates (the first with lora_prefetch_dir):
`prepare` with LORA_DIR on tag 25.05 converts two PEFT adapters into the cache (hf_lora_convert.py played by its
double) and fills the tensorrt_llm model to load them; the stand-in engine (tests/doubles/tensorrtllm_backend_double)
loads the prefetch folders with numpy at start, as the C++ backend does, and records each request's lora_task_id.
Real: tritonserver, its config parser and ensemble scheduler (which must carry lora_task_id from the ensemble to
tensorrt_llm), upstream's preprocessing/postprocessing model.py, the repository and command line the entrypoint wrote.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from harness import realtriton
from harness.image import KEY, Image, prepared_argv, templates_for
from harness.tiny_adapter import tiny_lora
from harness.tiny_checkpoint import PROMPT


def generate(server: realtriton.RunningServer, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server.http_url}/v2/models/ensemble/generate",
        data=json.dumps({"text_input": PROMPT, "max_tokens": 2, "bad_words": "", "stop_words": "", **body}).encode(),
        headers={"Content-Type": "application/json", realtriton.ADMIN_HEADER: KEY},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def engine_records(directory: Path) -> list[int | None]:
    path = directory / "tensorrtllm_backend.jsonl"
    return [json.loads(line)["lora_task_id"] for line in path.read_text().splitlines()] if path.exists() else []


def test_the_native_api_selects_an_adapter_by_task_id_through_upstreams_ensemble(tmp_path, real_triton):
    img = Image(tmp_path, "25.05", templates_for("v0.19.0"))
    loras = tmp_path / "loras"
    tiny_lora(loras / "sql", rank=4, modules=("q_proj", "v_proj"))
    tiny_lora(loras / "chat", rank=8, modules=("q_proj", "down_proj"), fill=1)
    result = img.run("prepare", WORKFLOW="engine", LORA_DIR=str(loras), TRITON_ADMIN_KEY=KEY)
    assert result.returncode == 0, result.stderr
    ids = _ids_from_text(result.stderr)  # the start log names each adapter with its task id
    assert set(ids) == {"sql", "chat"}
    argv = prepared_argv(img, KEY, LORA_DIR=str(loras))
    records = tmp_path / "engine-records"
    env = {**os.environ, "DOUBLE_RECORD_DIR": str(records)}
    with realtriton.start(real_triton, argv, env=env, log_dir=tmp_path) as server:
        asked = [{"lora_task_id": ids["sql"]}, {}, {"lora_task_id": ids["chat"]}, {"lora_task_id": 12345}]
        answers = [generate(server, body) for body in asked]
        log = server.log()
        assert server.stop() == 0, log[-3000:]
    assert [status for status, _ in answers] == [200, 200, 200, 400], answers
    assert "not found in cache" in answers[3][1]["error"]  # the backend's own words for a task it did not load
    # What reached the tensorrt_llm model through upstream's ensemble, request by request.
    assert engine_records(records) == [ids["sql"], None, ids["chat"], 12345]
    # The stand-in engine loaded exactly the folders the entrypoint converted, with numpy, at start.
    assert f"prefetched LoRA tasks {sorted(ids.values())}" in log


def _ids_from_text(stderr: str) -> dict[str, int]:
    """name -> task id from the start log's `adapter served` lines (text format: key=value fields)."""
    found = {}
    for line in stderr.splitlines():
        if "adapter served" in line:
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            found[fields["name"]] = int(fields["task_id"])
    return found
