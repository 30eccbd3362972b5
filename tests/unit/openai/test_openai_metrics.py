"""The OpenAI front's Prometheus metrics (openai/metrics.py): vLLM's names and buckets, one request's life, and the
sums across processes that share the multiprocess directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trtllm_entrypoint import contract
from trtllm_entrypoint.openai import metrics


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape by (name, labels): what Prometheus would store."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_1_2_5_buckets_stop_at_the_context():
    assert metrics.buckets_1_2_5(4096) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
    assert metrics.buckets_1_2_5(1) == (1,)


def test_one_request_is_measured_as_vllm_names_it():
    m = metrics.Metrics(max_model_len=4096)
    clock = Clock()
    request = m.request("llama", "sql-adapter", clock=clock)
    waiting = samples(m.exposition())
    assert value(waiting, "vllm:num_requests_waiting", model_name="llama", lora_name="sql-adapter") == 1
    clock.now += 0.25  # first token after 250 ms
    request.token()
    running = samples(m.exposition())
    assert value(running, "vllm:num_requests_waiting", model_name="llama", lora_name="sql-adapter") == 0
    assert value(running, "vllm:num_requests_running", model_name="llama", lora_name="sql-adapter") == 1
    for _ in range(3):  # three more tokens, 20 ms apart
        clock.now += 0.02
        request.token()
    clock.now += 0.01
    request.finish(["length"], prompt_tokens=7, generation_tokens=4)
    request.finish(["stop"], prompt_tokens=7, generation_tokens=4)  # a second finish changes nothing

    found = samples(m.exposition())
    labels = {"model_name": "llama", "lora_name": "sql-adapter"}
    assert value(found, "vllm:time_to_first_token_seconds_count", **labels) == 1
    assert value(found, "vllm:time_to_first_token_seconds_sum", **labels) == pytest.approx(0.25)
    assert value(found, "vllm:time_to_first_token_seconds_bucket", **labels, le="0.1") == 0
    assert value(found, "vllm:time_to_first_token_seconds_bucket", **labels, le="0.25") == 1
    assert value(found, "vllm:inter_token_latency_seconds_count", **labels) == 3
    assert value(found, "vllm:inter_token_latency_seconds_sum", **labels) == pytest.approx(0.06)
    assert value(found, "vllm:e2e_request_latency_seconds_sum", **labels) == pytest.approx(0.32)
    assert value(found, "vllm:prompt_tokens_total", **labels) == 7
    assert value(found, "vllm:generation_tokens_total", **labels) == 4
    assert value(found, "vllm:request_success_total", **labels, finished_reason="length") == 1
    assert value(found, "vllm:request_success_total", **labels, finished_reason="stop") == 0
    assert value(found, "vllm:num_requests_running", **labels) == 0
    assert value(found, "vllm:request_generation_tokens_bucket", **labels, le="5.0") == 1
    # vLLM's own buckets, so that histogram_quantile() over both reads the same
    les = sorted(float(dict(k[1])["le"]) for k in found if k[0] == "vllm:e2e_request_latency_seconds_bucket" and k[1])
    assert les[:-1] == list(metrics.E2E_BUCKETS) and les[-1] == float("inf")


def test_a_request_that_never_got_a_token_leaves_waiting_and_counts_as_abort():
    m = metrics.Metrics(max_model_len=128)
    request = m.request("llama")
    request.finish(["cancelled-by-client"], prompt_tokens=3, generation_tokens=0)
    found = samples(m.exposition())
    assert value(found, "vllm:num_requests_waiting", model_name="llama", lora_name="") == 0
    assert value(found, "vllm:request_success_total", model_name="llama", lora_name="", finished_reason="abort") == 1
    assert value(found, "vllm:time_to_first_token_seconds_count", model_name="llama", lora_name="") == 0


def test_several_choices_measure_the_gaps_within_each_choice():
    m = metrics.Metrics(max_model_len=128)
    clock = Clock()
    request = m.request("llama", clock=clock)
    for step in range(4):  # choices 0 and 1 alternate, 10 ms apart: each choice's gap is 20 ms
        clock.now += 0.01
        request.token(step % 2)
    request.finish(["stop", "length"], prompt_tokens=2, generation_tokens=4)
    found = samples(m.exposition())
    assert value(found, "vllm:inter_token_latency_seconds_count", model_name="llama", lora_name="") == 2
    assert value(found, "vllm:inter_token_latency_seconds_sum", model_name="llama", lora_name="") == pytest.approx(0.04)
    for reason in ("stop", "length"):
        assert value(found, "vllm:request_success_total", model_name="llama", lora_name="", finished_reason=reason) == 1


WORKER = textwrap.dedent(
    """
    import os, sys
    from trtllm_entrypoint.openai import metrics
    index, count = int(sys.argv[1]), int(sys.argv[2])
    m = metrics.Metrics(4096, os.environ["PROMETHEUS_MULTIPROC_DIR"])
    for k in range(count):
        r = m.request("llama", "a" if k % 2 else "")
        for _ in range(index + 1):
            r.token()
        r.finish(["stop"], prompt_tokens=10 + index, generation_tokens=index + 1)
    sys.stdout.buffer.write(m.exposition() if len(sys.argv) > 3 else b"")
    """
)


@pytest.mark.process
def test_every_process_that_shares_the_directory_is_summed_exactly(tmp_path):
    env = {**os.environ, contract.FRONT_METRICS_VARIABLE: str(tmp_path)}
    for index in range(3):  # three workers, one after another: 5 requests each
        subprocess.run([sys.executable, "-c", WORKER, str(index), "5"], env=env, check=True, timeout=60)
    # a fourth answers the scrape, as any worker of the front may
    scrape = subprocess.run(
        [sys.executable, "-c", WORKER, "3", "1", "scrape"], env=env, check=True, timeout=60, capture_output=True
    ).stdout
    found = samples(scrape)
    base, adapter = {"model_name": "llama", "lora_name": ""}, {"model_name": "llama", "lora_name": "a"}
    # per worker i: requests k=0,2,4 on the base, 1,3 on the adapter; prompt 10+i, generation i+1 each
    assert value(found, "vllm:prompt_tokens_total", **base) == 3 * (10 + 11 + 12) + 13
    assert value(found, "vllm:prompt_tokens_total", **adapter) == 2 * (10 + 11 + 12)
    assert value(found, "vllm:generation_tokens_total", **base) == 3 * (1 + 2 + 3) + 4
    assert value(found, "vllm:generation_tokens_total", **adapter) == 2 * (1 + 2 + 3)
    assert value(found, "vllm:request_success_total", **base, finished_reason="stop") == 10
    assert value(found, "vllm:time_to_first_token_seconds_count", **base) == 10
    assert value(found, "vllm:inter_token_latency_seconds_count", **base) == 3 * (0 + 1 + 2) + 3
    assert value(found, "vllm:num_requests_running", **base) == 0


def test_gathered_gaps_expose_exactly_what_observing_each_would():
    import random

    import prometheus_client as prom

    rng = random.Random(7)
    # every bucket's bound itself (le is inclusive), values between them, and past the last one
    values = [*metrics.ITL_BUCKETS, *(rng.uniform(0, 100) for _ in range(300)), 0.0, 1e6]
    exposed = []
    for gather in (False, True):
        registry = prom.CollectorRegistry()
        child = prom.Histogram("itl", "gaps", ["m"], buckets=metrics.ITL_BUCKETS, registry=registry).labels("x")
        tally = metrics.Tally(child)
        for v in values:
            tally.observe(v) if gather else child.observe(v)
        tally.flush()
        exposed.append(samples(prom.generate_latest(registry)))
    observed, gathered = exposed
    assert gathered.keys() == observed.keys()
    for key, expected in observed.items():
        if not key[0].endswith("_created"):
            assert gathered[key] == pytest.approx(expected), key


def test_a_long_answers_gaps_reach_a_scrape_before_it_ends():
    m = metrics.Metrics(max_model_len=4096)
    clock = Clock()
    request = m.request("llama", clock=clock)
    for _ in range(metrics.Tally.FLUSH + 1):  # FLUSH gaps after the first token
        clock.now += 0.01
        request.token()
    found = samples(m.exposition())
    assert (
        value(found, "vllm:inter_token_latency_seconds_count", model_name="llama", lora_name="") == metrics.Tally.FLUSH
    )
