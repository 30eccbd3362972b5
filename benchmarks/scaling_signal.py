"""The autoscaling signal on the real tritonserver: closed-loop load at several concurrencies on the engine model, and
the queue/compute ratio each step gives, computed from the server's own /metrics with the manifests' formula
(trtllm_images.kserve.scaling).

The server runs a repository filled by our entrypoint, with the engine model alone loaded (one instance, batch size
1): it then serves one request at a time, so its capacity is one request in flight, and a closed loop of c clients
keeps c - 1 requests waiting behind the one in service. The ratio should follow that: ~0 at c = 1, ~c - 1 beyond.
The tests (tests/unit/test_scaling_signal.py) assert it; `python -m benchmarks --only scaling` records the table.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.report import Metric, Target
from benchmarks.serving_stats import percentile
from trtllm_images.kserve import scaling

ENGINE = "tensorrt_llm"
PROMPT_IDS = [3, 4, 5, 6, 7, 8]
OUTPUT_TOKENS = 8
TOKEN_DELAY_S = 0.01  # the engine double's decode step: the service time is OUTPUT_TOKENS of them
CONCURRENCIES = (1, 2, 4, 8, 16)
CAPACITY_IN_FLIGHT = 1  # one instance, max_batch_size 1
LIGHT_BELOW, OVERLOAD_ABOVE = 0.1, 1.0  # what the issue asks of the signal


@dataclass(frozen=True)
class Step:
    concurrency: int
    ratio: float  # the manifests' formula over this step's scrapes
    throughput: float  # requests per second
    p99_s: float
    requests: int

    @property
    def offered_over_capacity(self) -> float:
        return self.concurrency / CAPACITY_IN_FLIGHT


def server_settings() -> dict[str, str]:
    """What `prepare` gets: one request at a time through the engine model."""
    return {"MAX_BATCH_SIZE": "1"}


def engine_only(argv: list[str]) -> list[str]:
    """The served command with only the engine model loaded (what a worker rank loads too)."""
    return [*argv, "--model-control-mode=explicit", f"--load-model={ENGINE}"]


def server_env() -> dict[str, str]:
    return {**os.environ, "TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S": str(TOKEN_DELAY_S)}


def _request_body() -> bytes:
    tensors = [
        ("input_ids", [1, len(PROMPT_IDS)], PROMPT_IDS),
        ("input_lengths", [1, 1], [len(PROMPT_IDS)]),
        ("request_output_len", [1, 1], [OUTPUT_TOKENS]),
    ]
    inputs = [{"name": n, "shape": s, "datatype": "INT32", "data": d} for n, s, d in tensors]
    return json.dumps({"inputs": inputs}).encode()


def scrape(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        return scaling.counters(response.read().decode(), scaling.ENGINE_STAGES)


@dataclass
class Load:
    """What a closed loop of clients saw: (when answered, latency) per request, and the first errors."""

    latencies: list[tuple[float, float]] = field(default_factory=list)
    errors: list[OSError] = field(default_factory=list)


@contextmanager
def closed_loop(http_url: str, concurrency: int) -> Iterator[Load]:
    """`concurrency` clients on the engine model, each sending the next request when its last one is answered, for
    as long as the block runs; requests that failed raise when it ends."""
    body, url = _request_body(), f"{http_url}/v2/models/{ENGINE}/infer"
    stop, load, lock = threading.Event(), Load(), threading.Lock()

    def client() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120) as response:
                    response.read()
            except OSError as exc:
                load.errors.append(exc)
                return
            with lock:
                load.latencies.append((time.monotonic(), time.monotonic() - started))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        yield load
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    if load.errors:
        raise RuntimeError(f"requests failed at concurrency {concurrency}: {load.errors[0]}")


def measure(http_url: str, metrics_url: str, concurrency: int, seconds: float, warmup_s: float = 1.0) -> Step:
    """`concurrency` clients for `seconds` after a warm-up; the ratio from the scrapes that bracket the measured
    window."""
    with closed_loop(http_url, concurrency) as load:
        time.sleep(warmup_s)
        before, start = scrape(metrics_url), time.monotonic()
        time.sleep(seconds)
        after, end = scrape(metrics_url), time.monotonic()
    window = [latency for done, latency in load.latencies if start <= done <= end]
    return Step(
        concurrency=concurrency,
        ratio=scaling.ratio(before, after, end - start),
        throughput=len(window) / (end - start),
        p99_s=percentile(window, 99) if window else float("nan"),
        requests=len(window),
    )


def sweep(work: Path, seconds: float, say, concurrencies: tuple[int, ...] = CONCURRENCIES) -> list[Step]:
    """Fill a repository with the entrypoint, start the real server on it, and measure each concurrency."""
    from harness import realtriton
    from harness.image import KEY, Image, prepared_argv, templates_for

    image = Image(work, "25.01", templates_for("v0.17.0"))
    argv = engine_only(prepared_argv(image, KEY, **server_settings()))
    metrics_port = next(a.split("=", 1)[1] for a in argv if a.startswith("--metrics-port="))
    steps = []
    with realtriton.start(realtriton.host_layout(), argv, env=server_env(), log_dir=work) as server:
        for concurrency in concurrencies:
            step = measure(server.http_url, f"http://127.0.0.1:{metrics_port}/metrics", concurrency, seconds)
            say(f"scaling signal: c={concurrency} ratio {step.ratio:.2f} {step.throughput:.1f} req/s")
            steps.append(step)
    return steps


def metrics(steps: list[Step]) -> list[Metric]:
    rows = []
    for step in steps:
        target = None
        if step.concurrency == 1:
            target = Target("<", LIGHT_BELOW)
        elif step.offered_over_capacity >= 4:
            target = Target(">", OVERLOAD_ABOVE)
        details = {"throughput_rps": step.throughput, "p99_s": step.p99_s, "requests": step.requests}
        rows.append(
            Metric(
                f"scaling signal: queue/compute ratio at c={step.concurrency}", step.ratio, "", target, details=details
            )
        )
        rows.append(Metric(f"scaling signal: throughput at c={step.concurrency}", step.throughput, "req/s"))
        rows.append(Metric(f"scaling signal: p99 latency at c={step.concurrency}", step.p99_s, "s"))
    return rows


def markdown(steps: list[Step]) -> str:
    """The table docs/benchmarks.md keeps: load, ratio, throughput, p99."""
    lines = [
        "| clients (load / capacity) | queue/compute ratio | throughput (req/s) | p99 latency (s) |",
        "|---|---|---|---|",
    ]
    for s in steps:
        lines.append(
            f"| {s.concurrency} ({s.offered_over_capacity:g}x) | {s.ratio:.2f} | {s.throughput:.1f} | {s.p99_s:.3f} |"
        )
    return "\n".join(lines)
