"""The autoscaling signal: how long requests wait in Triton's queues against how long they compute.

One formula, two readers: `query` writes it as PromQL for the manifests (KServe's KEDA autoscaler, the LWS
ScaledObject), and `ratio` applies it to two scrapes of a server's own /metrics (the real-server test, the
benchmark). Both sum over the same models, so what the tests measure is what the cluster scales on.

Which models: the pipeline's stages (preprocessing, tensorrt_llm, postprocessing), summed. The ensemble in front of
them never queues (its scheduler hands each request straight to the first stage) while its compute time spans the
whole pipeline, so it would only dilute the ratio; a request waiting before any stage is waiting for capacity. The
LLM-API workflow serves one model, named after the service, which is its only stage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

QUEUE_METRIC = "nv_inference_queue_duration_us"  # counter, per model: time requests waited for an instance
COMPUTE_METRIC = "nv_inference_compute_infer_duration_us"  # counter, per model: time the model computed
ENGINE_STAGES = ("preprocessing", "tensorrt_llm", "postprocessing")
WINDOW = "1m"  # long enough for a 15 s scrape interval to give rate() four points
# A compute rate below 1 µs/s means the server is idle: the ratio is then 0, not a division by (nearly) zero.
MIN_COMPUTE_US_PER_S = 1

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def stage_models(workflow: str, served_name: str) -> tuple[str, ...]:
    """The models whose queues the ratio sums for a workflow (the LLM-API repository has one, the served one)."""
    return ENGINE_STAGES if workflow == "engine" else (served_name,)


def query(models: Sequence[str], selectors: Mapping[str, str], window: str = WINDOW) -> str:
    """PromQL: queue time over compute time, summed over `models` of the pods `selectors` pick (label -> regex)."""
    labels = ",".join([f'model=~"{"|".join(models)}"'] + [f'{key}=~"{value}"' for key, value in selectors.items()])
    queue = f"sum(rate({QUEUE_METRIC}{{{labels}}}[{window}]))"
    compute = f"sum(rate({COMPUTE_METRIC}{{{labels}}}[{window}]))"
    return f"{queue} / clamp_min({compute}, {MIN_COMPUTE_US_PER_S})"


def counters(metrics_text: str, models: Sequence[str]) -> dict[str, float]:
    """QUEUE_METRIC and COMPUTE_METRIC summed over `models`, from Prometheus' text format (a /metrics page)."""
    totals = {QUEUE_METRIC: 0.0, COMPUTE_METRIC: 0.0}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match["name"] not in totals:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
        if labels.get("model") in models:
            totals[match["name"]] += float(match["value"])
    return totals


def ratio(before: Mapping[str, float], after: Mapping[str, float], seconds: float) -> float:
    """`query` over one interval: the rates of the two counters between two scrapes `seconds` apart."""
    queue_rate = (after[QUEUE_METRIC] - before[QUEUE_METRIC]) / seconds
    compute_rate = (after[COMPUTE_METRIC] - before[COMPUTE_METRIC]) / seconds
    return queue_rate / max(compute_rate, MIN_COMPUTE_US_PER_S)


def quantity(value: float) -> str:
    """A Kubernetes quantity for a target ratio: 1 -> "1", 0.5 -> "500m"."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
