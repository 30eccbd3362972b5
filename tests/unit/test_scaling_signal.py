"""The autoscaling signal: the formula the manifests use, applied here to the REAL tritonserver 2.51's own /metrics.

Real: tritonserver, its scheduler queue, its counters, and the repository our entrypoint filled. The engine double
only decides how long one request takes; the assertions are about load against capacity (one request in flight),
not about that time: a closed loop of c clients keeps c - 1 requests queued behind the one in service.
"""

from __future__ import annotations

import pytest

from benchmarks import scaling_signal
from harness import realtriton
from harness.image import KEY, Image, prepared_argv, templates_for
from trtllm_images.kserve import scaling

METRICS = """# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="ensemble",version="1"} 0
nv_inference_queue_duration_us{model="preprocessing",version="1"} 1500
nv_inference_queue_duration_us{model="tensorrt_llm",version="1"} 2500
nv_inference_compute_infer_duration_us{model="ensemble",version="1"} 90000
nv_inference_compute_infer_duration_us{model="preprocessing",version="1"} 1000
nv_inference_compute_infer_duration_us{model="tensorrt_llm",version="1"} 4000
nv_inference_compute_infer_duration_us{model="postprocessing",version="1"} 5000
nv_inference_request_success{model="tensorrt_llm",version="1"} 7
"""


def test_counters_sum_the_stages_and_leave_the_ensemble_out():
    assert scaling.counters(METRICS, scaling.ENGINE_STAGES) == {
        scaling.QUEUE_METRIC: 4000.0,
        scaling.COMPUTE_METRIC: 10000.0,
    }
    assert scaling.counters(METRICS, ("llm",)) == {scaling.QUEUE_METRIC: 0.0, scaling.COMPUTE_METRIC: 0.0}


def test_ratio_is_the_query_over_one_interval():
    before = {scaling.QUEUE_METRIC: 1000.0, scaling.COMPUTE_METRIC: 2000.0}
    after = {scaling.QUEUE_METRIC: 7000.0, scaling.COMPUTE_METRIC: 5000.0}
    assert scaling.ratio(before, after, 2.0) == pytest.approx(2.0)
    # An idle server: no compute, no queue -> 0 (clamp_min), never a division by zero.
    assert scaling.ratio(before, before, 2.0) == 0.0


def test_query_is_promql_over_the_same_models():
    query = scaling.query(scaling.ENGINE_STAGES, {"namespace": "ns", "pod": "llm-predictor-.*"})
    labels = 'model=~"preprocessing|tensorrt_llm|postprocessing",namespace=~"ns",pod=~"llm-predictor-.*"'
    assert query == (
        f"sum(rate(nv_inference_queue_duration_us{{{labels}}}[1m])) / "
        f"clamp_min(sum(rate(nv_inference_compute_infer_duration_us{{{labels}}}[1m])), 1)"
    )
    assert scaling.stage_models("llmapi", "chat") == ("chat",)
    assert [scaling.quantity(v) for v in (1, 1.0, 0.5, 2.25, 10)] == ["1", "1", "500m", "2250m", "10"]


def test_the_ratio_tracks_offered_load_against_capacity_on_the_real_server(tmp_path, real_triton):
    image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    argv = scaling_signal.engine_only(prepared_argv(image, KEY, **scaling_signal.server_settings()))
    metrics_port = next(a.split("=", 1)[1] for a in argv if a.startswith("--metrics-port="))
    with realtriton.start(real_triton, argv, env=scaling_signal.server_env(), log_dir=tmp_path) as server:
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        steps = {c: scaling_signal.measure(server.http_url, metrics_url, c, seconds=3.0) for c in (1, 4, 12)}
        assert server.stop() == 0, server.log()[-3000:]

    light, busy, overloaded = steps[1], steps[4], steps[12]
    assert all(step.requests >= 5 for step in steps.values()), steps
    # At the load the server can take, nothing waits; well past it, requests wait longer than they compute.
    assert light.ratio < scaling_signal.LIGHT_BELOW, steps
    assert overloaded.ratio > scaling_signal.OVERLOAD_ABOVE, steps
    # Capacity is one request in flight: each request waits for the c - 1 ahead of it (generous bounds: the machine
    # is shared and the HTTP front end adds its own time outside both counters).
    for step in (busy, overloaded):
        expected = step.offered_over_capacity - 1
        assert 0.5 * expected <= step.ratio <= 1.5 * expected, (step, expected)
    assert light.ratio < busy.ratio < overloaded.ratio, steps
    # Past capacity, more clients add waiting, not throughput.
    assert overloaded.throughput < 1.5 * busy.throughput, steps
