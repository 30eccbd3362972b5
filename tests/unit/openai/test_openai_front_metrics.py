"""The front's /metrics (openai/metrics.py through serving.py): the token counters equal the `usage` the same requests
reported, whole, streamed and with n > 1, per served model and adapter; each answer is counted by its finish reason,
`abort` when it did not end by itself; and across several worker processes on one port the counts are exact.
The official `openai` client asks; tritonserver is the FAKE (harness/fake_triton.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.fake_triton import FakeTriton, Reply, words
from harness.realtriton import free_port
from trtllm_entrypoint import contract
from trtllm_entrypoint.launch import supervise
from trtllm_entrypoint.openai.plan import FrontPlan

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

# The official client asks the platform for its headers once (`uname -p`): a program, so this layer.
pytestmark = pytest.mark.process

ENTRYPOINTS = Path(__file__).resolve().parents[3] / "entrypoints"
LORA_CONFIG = """name: "ensemble"
input [
  { name: "text_input" }, { name: "max_tokens" }, { name: "stream" }, { name: "bad_words" }, { name: "stop_words" },
  { name: "lora_task_id" }
]
output [ { name: "text_output" } ]
"""
ADAPTERS = {"sql": 7}


def scrape(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(found, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls)


@pytest.fixture
def lora_plan(kit, tmp_path):
    config = tmp_path / "lora" / "ensemble" / "config.pbtxt"
    config.parent.mkdir(parents=True)
    config.write_text(LORA_CONFIG)
    return {"config": str(config), "adapters": ADAPTERS}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_the_token_counters_equal_the_usage_the_answers_reported(kit, lora_plan):
    fake = FakeTriton(lambda body: words("one two three four five six"))
    messages = [{"role": "user", "content": "what is it"}]

    async def calls(url):
        usages = {"": [], "sql": []}
        async with client(url) as api:
            for model, lora in (("ensemble", ""), ("sql", "sql")):
                whole = await api.completions.create(model=model, prompt="a b c", max_tokens=4, n=2)
                chat = await api.chat.completions.create(model=model, messages=messages, max_tokens=9)
                stream = await api.completions.create(
                    model=model, prompt="a b", max_tokens=3, stream=True, stream_options={"include_usage": True}
                )
                last = [chunk async for chunk in stream][-1]
                usages[lora] += [whole.usage, chat.usage, last.usage]
            async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as reply:
                return usages, reply.status, reply.headers["Content-Type"], await reply.text()

    usages, status, content_type, text = kit.ask(fake, calls, **lora_plan)
    assert status == 200 and content_type.startswith("text/plain")
    found = scrape(text)
    for lora, reported in usages.items():
        labels = {"model_name": "ensemble", "lora_name": lora}
        assert total(found, "vllm:prompt_tokens_total", **labels) == sum(u.prompt_tokens for u in reported) > 0
        assert total(found, "vllm:generation_tokens_total", **labels) == sum(u.completion_tokens for u in reported)
        # n=2 counts two answers; the chat answer ran out of words (stop), the others hit max_tokens (length)
        assert total(found, "vllm:request_success_total", finished_reason="length", **labels) == 3
        assert total(found, "vllm:request_success_total", finished_reason="stop", **labels) == 1
        assert total(found, "vllm:time_to_first_token_seconds_count", **labels) == 3
        assert total(found, "vllm:e2e_request_latency_seconds_count", **labels) == 3
        assert total(found, "vllm:num_requests_running", **labels) == total(found, "vllm:num_requests_waiting") == 0


def test_answers_that_do_not_end_by_themselves_count_as_abort(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["a", "b"], error="the model failed"))

    async def calls(url):
        async with client(url) as api:
            with pytest.raises(openai.APIError):
                await api.completions.create(model="ensemble", prompt="p", max_tokens=8)
            stream = await api.completions.create(model="ensemble", prompt="p", max_tokens=8, stream=True)
            with pytest.raises(openai.APIError, match="the model failed"):  # the error event, in the stream
                async for _ in stream:
                    pass
        async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as reply:
            return await reply.text()

    found = scrape(kit.ask(fake, calls))
    assert total(found, "vllm:request_success_total", finished_reason="abort") == 2
    assert total(found, "vllm:request_success_total", finished_reason="stop") == 0
    assert total(found, "vllm:generation_tokens_total") == 4  # what came before the error
    assert total(found, "vllm:num_requests_running") == 0


def test_a_client_that_leaves_mid_stream_is_counted_once_as_abort(kit):
    fake = FakeTriton(lambda body: Reply(pieces=["x"] * 50, delay_s=0.05))

    async def calls(url):
        async with aiohttp.ClientSession() as session:
            body = {"model": "ensemble", "prompt": "p", "max_tokens": 50, "stream": True}
            async with session.post(f"{url}/v1/completions", json=body) as reply:
                await reply.content.readline()  # the first event, then leave
            await asyncio.wait_for(fake.client_closed.wait(), 10)
            for _ in range(100):  # the handler ends shortly after the backend saw the close
                async with session.get(f"{url}/metrics") as metrics:
                    found = scrape(await metrics.text())
                if total(found, "vllm:e2e_request_latency_seconds_count"):
                    return found
                await asyncio.sleep(0.05)
            return found

    found = kit.ask(fake, calls)
    assert (
        total(found, "vllm:request_success_total")
        == total(found, "vllm:request_success_total", finished_reason="abort")
        == 1
    )
    assert total(found, "vllm:num_requests_running") == total(found, "vllm:num_requests_waiting") == 0


def test_several_workers_on_one_port_report_exact_totals(kit, tmp_path):
    """Three worker processes share the port (SO_REUSEPORT) and one metrics directory, as the supervisor starts them;
    requests on separate connections spread over them, and whichever worker answers a scrape reports the sums."""
    fake = FakeTriton(lambda body: words("w1 w2 w3 w4 w5"))
    with fake.running() as url, supervise.metrics_dir() as directory:
        plan = FrontPlan(**{**kit.plan.__dict__, "triton_url": url, "port": free_port(), "workers": 3})
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ENTRYPOINTS), os.environ.get("PYTHONPATH", "")) if p),
            contract.FRONT_PLAN_VARIABLE: plan.to_json(),
            contract.FRONT_METRICS_VARIABLE: directory,
        }
        workers = [
            subprocess.Popen([sys.executable, "-m", "trtllm_entrypoint.openai"], env=env, stderr=subprocess.DEVNULL)
            for _ in range(3)
        ]
        base = f"http://127.0.0.1:{plan.port}"
        try:
            wait_ready(base, workers)
            reported = []
            for i in range(40):  # a new client (a new connection) each time: the kernel spreads them
                with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30) as api:
                    if i % 2:
                        answer = api.completions.create(
                            model="ensemble", prompt="a b c d"[: 1 + i % 7], max_tokens=1 + i % 5
                        )
                        reported.append(answer.usage)
                    else:
                        stream = api.completions.create(
                            model="ensemble", prompt="x y", max_tokens=1 + i % 4, stream=True,
                            stream_options={"include_usage": True},
                        )  # fmt: skip
                        chunks = list(stream)
                        reported.append(chunks[-1].usage)
            pids = {name.rsplit("_", 1)[-1] for name in os.listdir(directory) if name.startswith("histogram_")}
            scrapes = [scrape(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()) for _ in range(6)]  # noqa: S310
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            codes = [worker.wait(timeout=30) for worker in workers]
    assert len(pids) >= 2, f"the requests reached only {pids}: nothing shows the sums across workers"
    prompt, generated = sum(u.prompt_tokens for u in reported), sum(u.completion_tokens for u in reported)
    for found in scrapes:  # every worker answers with the same totals
        assert total(found, "vllm:prompt_tokens_total") == prompt
        assert total(found, "vllm:generation_tokens_total") == generated
        assert total(found, "vllm:request_success_total") == len(reported)
        assert total(found, "vllm:time_to_first_token_seconds_count") == len(reported)
    assert codes == [0, 0, 0]


def wait_ready(base: str, workers: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if urllib.request.urlopen(f"{base}/health/live", timeout=5).status == 200:  # noqa: S310
                return
        except OSError:
            pass
        assert all(w.poll() is None for w in workers) and time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
