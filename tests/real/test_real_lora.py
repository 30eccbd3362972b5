"""LoRA adapters on the REAL tritonserver 2.51 with upstream's v0.19.0 templates (the first with lora_prefetch_dir):
`prepare` with LORA_DIR on tag 25.05 converts two PEFT adapters into the cache (hf_lora_convert.py played by its
double) and fills the tensorrt_llm model to load them; the stand-in engine (tests/doubles/tensorrtllm_backend_double)
loads the prefetch folders with numpy at start, as the C++ backend does, and records each request's lora_task_id.
Real: tritonserver, its config parser and ensemble scheduler (which must carry lora_task_id from the ensemble to
tensorrt_llm), upstream's preprocessing/postprocessing model.py, the repository and command line the entrypoint wrote,
our OpenAI front (two workers) asked by the official client, and Debian's Prometheus scraping the front and Triton's
metrics port and evaluating the Grafana dashboard's queries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from harness import realfront, realtriton
from harness.image import KEY, Image, prepared_argv, templates_for
from harness.realtriton import ENGINE_DOUBLE
from harness.tiny_adapter import tiny_lora
from harness.tiny_checkpoint import PROMPT

openai = pytest.importorskip("openai")


def private_backends(layout: realtriton.Layout, root: Path) -> str:
    """`--backend-directory` of this test's own: Triton's Python backend as installed (3 MB) and this checkout's engine
    double. The shared cache's double is whichever checkout installed one last; a server that loads another's
    mid-test would not know LoRA."""
    backends = root / "backends"
    shutil.copytree(layout.backends / "python", backends / "python", symlinks=True)
    (backends / "tensorrtllm").mkdir()
    shutil.copyfile(ENGINE_DOUBLE, backends / "tensorrtllm" / "model.py")
    return f"--backend-directory={backends}"


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
    backends = private_backends(real_triton, tmp_path)
    with realtriton.start(real_triton, [*argv, backends], env=env, log_dir=tmp_path) as server:
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


def prometheus(work: Path, targets: list[str]) -> tuple[subprocess.Popen, str]:
    """A real Prometheus (Debian's) scraping `targets` every second; its API URL once every target is up."""
    binary = shutil.which("prometheus")
    if binary is None:
        message = "Debian's `prometheus` is not installed (apt-get install prometheus; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, so a real Prometheus must run: {message}")
        pytest.skip(message)
    config = work / "prometheus.yml"
    job = {"job_name": "trtllm", "scrape_interval": "1s", "static_configs": [{"targets": targets}]}
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}))
    port = realtriton.free_port()
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            active = query_api(url, "/api/v1/targets")["activeTargets"]
            if len(active) == len(targets) and all(t["health"] == "up" for t in active):
                return process, url
        except OSError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise AssertionError("Prometheus never scraped every target")


def query_api(url: str, path: str, **params: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as reply:  # noqa: S310
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return body["data"]


def by_label(url: str, query: str, label: str) -> dict[str, float]:
    return {
        r["metric"].get(label, ""): float(r["value"][1]) for r in query_api(url, "/api/v1/query", query=query)["result"]
    }


def test_the_openai_front_selects_adapters_by_name_and_prometheus_reads_their_metrics(tmp_path, real_triton):
    img = Image(tmp_path, "25.05", templates_for("v0.19.0"))
    loras = tmp_path / "loras"
    tiny_lora(loras / "sql", rank=4, modules=("q_proj", "v_proj"))
    tiny_lora(loras / "chat", rank=8, modules=("q_proj", "down_proj"), fill=1)
    ports = {name: str(realtriton.free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT")}
    result = img.run(
        "prepare", FRONTEND="openai", WORKFLOW="engine", LORA_DIR=str(loras), TRITON_ADMIN_KEY=KEY,
        OPENAI_WORKERS="2", **ports,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    ids, name = out["front"]["plan"]["adapters"], out["ready"]["served_model_name"]
    entry = out["front"]["plan"]["entry_model"]  # Triton's name for the model the front asks
    records = tmp_path / "engine-records"
    env = {**os.environ, "DOUBLE_RECORD_DIR": str(records)}
    asked = ["sql", name, "chat", "sql"]
    out["argv"].append(private_backends(real_triton, tmp_path))
    with realfront.start(real_triton, out, KEY, env=env, log_dir=tmp_path) as front:
        api = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=60)
        cards = {m.id: m.model_extra.get("parent") for m in api.models.list().data}
        usages = {}
        for model in asked[:3]:
            usages.setdefault(model, []).append(api.completions.create(model=model, prompt=PROMPT, max_tokens=3).usage)
        chunks = list(api.completions.create(
            model="sql", prompt=PROMPT, max_tokens=2, stream=True, stream_options={"include_usage": True}))  # fmt: skip
        usages["sql"].append(chunks[-1].usage)
        with pytest.raises(openai.NotFoundError) as unknown:
            api.completions.create(model="sql-v2", prompt=PROMPT, max_tokens=2)
        scraper, url = prometheus(tmp_path, [f"127.0.0.1:{ports['OPENAI_PORT']}", f"127.0.0.1:{ports['METRICS_PORT']}"])
        try:
            time.sleep(2)  # a scrape after the last request
            generated = by_label(url, "sum by (lora_name) (vllm:generation_tokens_total)", "lora_name")
            prompt = by_label(url, "sum by (lora_name) (vllm:prompt_tokens_total)", "lora_name")
            dashboard = {
                query: query_api(url, "/api/v1/query", query=query)["result"]
                for query in dashboard_queries()
                if "vllm:" in query
            }
            triton = by_label(url, "sum by (model) (nv_inference_request_success)", "model")
        finally:
            scraper.terminate()
            scraper.wait(timeout=10)
        assert front.stop() == 0, front.log()[-3000:]

    assert cards == {name: None, "sql": name, "chat": name}
    assert unknown.value.response.json()["error"]["code"] == "model_not_found"
    # Upstream's ensemble carried each adapter's task id to the engine; the base model sent none.
    assert engine_records(records) == [ids["sql"], None, ids["chat"], ids["sql"]]
    # Prometheus read the front's counters, summed over both workers, equal to the usage each answer reported.
    lora = {"sql": "sql", name: "", "chat": "chat"}
    for model, reported in usages.items():
        assert generated[lora[model]] == sum(u.completion_tokens for u in reported)
        assert prompt[lora[model]] == sum(u.prompt_tokens for u in reported)
    assert all(dashboard.values()), [q for q, r in dashboard.items() if not r]  # every front panel has data
    assert triton.get(entry) == 4 and triton.get("tensorrt_llm") == 4  # Triton's port beside it


def dashboard_queries() -> list[str]:
    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "trtllm-images.json").read_text()
    )
    return [
        target["expr"].replace("$__rate_interval", "1m").replace("$model_name", ".*")
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
