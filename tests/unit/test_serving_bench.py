"""The serving benchmark's pure parts: statistics, the plan of server runs, the targets, the plot's series.
(The numbers themselves come from `python -m benchmarks --only serving` on the real server.)"""

from __future__ import annotations

import pytest

from benchmarks import serving_bench as sb
from benchmarks.plot import unary_series
from benchmarks.report import format_value
from benchmarks.run import selected_suites
from benchmarks.serving_stats import StreamRun, UnaryRun, per_token_overhead_s, percentile, token_gaps


def test_percentile_interpolates_between_ranks():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert (percentile(values, 0), percentile(values, 50), percentile(values, 100)) == (1.0, 3.0, 5.0)
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile(list(map(float, range(101))), 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_unary_run_throughput_and_latency():
    run = UnaryRun(concurrency=4, seconds=2.0, latencies_s=(0.01, 0.02, 0.03, 0.04))
    assert run.throughput == 2.0
    assert run.p(50) == pytest.approx(0.025)


def test_streaming_ttft_and_inter_token_gaps():
    run = StreamRun(concurrency=2, seconds=1.0, sent_s=(0.0, 1.0), arrivals_s=((0.1, 0.2, 0.35), (1.05, 1.06)))
    assert run.ttft_s == pytest.approx([0.1, 0.05])
    assert run.itl_s == pytest.approx([0.1, 0.15, 0.01])  # n - 1 gaps per stream, never across streams
    assert run.tokens_per_s == 5.0
    assert token_gaps([(1.0,)]) == []
    assert per_token_overhead_s(0.0106, 0.010) == pytest.approx(0.0006)


def test_plan_compares_ours_with_the_seeds_at_every_concurrency():
    runs = sb.plan(sweep=(1, 4))
    unary = {
        (r.pipeline, load.concurrency)
        for r in runs
        if not r.decoupled and r.token_delay_s == 0
        for load in r.loads
        if load.model == "ensemble"
    }
    assert {load.model for load in runs[0].loads} == {"ensemble", "tensorrt_llm"}  # the engine's ceiling, on ours
    for pipeline in (sb.OURS, sb.SEEDS):
        assert {(pipeline, c) for c in (1, 16, 64)} <= unary
    streamed = [r for r in runs if r.decoupled and r.pipeline in (sb.OURS, sb.SEEDS)]
    # Both delays, each with the engine alone on the same server as the per-token baseline.
    assert {(r.pipeline, r.token_delay_s) for r in streamed} == {
        (p, d) for p in (sb.OURS, sb.SEEDS) for d in (0.0, sb.TOKEN_DELAY_S)
    }
    assert all({load.model for load in r.loads} == {"ensemble", "tensorrt_llm"} for r in streamed)
    swept = sorted({r.pipeline.instances for r in runs if r.pipeline not in (sb.OURS, sb.SEEDS)})
    assert swept == [1, 4]
    # Ours and the seeds' alternate, so drift on the machine hits both.
    assert [r.pipeline for r in runs[:2]] == [sb.OURS, sb.SEEDS]


def test_pipelines_ask_the_entrypoint_for_what_they_compare():
    assert sb.OURS.env() == {} and not sb.OURS.bls  # our defaults: instances from the CPUs, no BLS
    assert sb.SEEDS.env() == {"PREPROCESSING_INSTANCES": "1", "POSTPROCESSING_INSTANCES": "1"} and sb.SEEDS.bls


def unary(pipeline, concurrency, latency_s, count, model="ensemble"):
    run = sb.ServerRun(pipeline, False, 0.0, ())
    return sb.Result(run, sb.Load("unary", model, concurrency), UnaryRun(concurrency, 1.0, (latency_s,) * count))


def stream(pipeline, model, delay_s, gap_s, tokens=16, streams=4):
    run = sb.ServerRun(pipeline, True, delay_s, ())
    arrivals = tuple(tuple(0.02 + i * gap_s for i in range(tokens)) for _ in range(streams))
    return sb.Result(run, sb.Load("stream", model, 16), StreamRun(16, 1.0, (0.0,) * streams, arrivals))


def by_name(metrics):
    return {m.name: m for m in metrics}


def test_targets_pass_and_fail_on_the_measured_ratios():
    results = [
        unary(sb.OURS, 64, 0.050, 1300),
        unary(sb.SEEDS, 64, 0.060, 1000),
        unary(sb.OURS, 1, 0.0033, 300),
        unary(sb.SEEDS, 1, 0.0030, 330),
        stream(sb.OURS, "ensemble", sb.TOKEN_DELAY_S, 0.0104),
        stream(sb.OURS, "tensorrt_llm", sb.TOKEN_DELAY_S, 0.0101),
    ]
    metrics = by_name(sb.target_metrics(results))
    assert metrics["unary c=64: throughput ours/seeds"].value == pytest.approx(1.3)
    # Retired on 2 CPUs: information with its reason, never a failure of `python -m benchmarks`.
    assert metrics["unary c=64: throughput ours/seeds"].status == "info"
    assert metrics["unary c=64: throughput ours/seeds"].note.startswith("retired target")
    assert metrics["unary c=64: p99 ours/seeds"].status == "info"  # retired too, on 2 and on 16 cores
    assert metrics["unary c=64: p99 ours/seeds"].note.startswith("retired target")
    assert metrics["unary c=1: p50 ours/seeds"].value == pytest.approx(1.1)
    added = next(m for name, m in metrics.items() if "ensemble minus engine alone" in name)
    assert added.value == pytest.approx(0.3) and added.unit == "ms" and added.status == "pass"
    over = next(m for name, m in metrics.items() if "p50 ITL minus" in name)
    assert over.value == pytest.approx(0.4) and over.status == "info"
    assert "unary c=64: ours / the engine double alone" not in metrics  # not measured: no row


def test_the_engine_alone_is_reported_as_the_ceiling():
    results = [unary(sb.OURS, 64, 0.05, 900), unary(sb.OURS, 64, 0.05, 1000, model="tensorrt_llm")]
    ceiling = by_name(sb.target_metrics(results))["unary c=64: ours / the engine double alone"]
    assert ceiling.value == pytest.approx(0.9) and "1000 req/s" in ceiling.note and ceiling.status == "info"
    assert unary_series(results)["engine alone"] == [(64, 1000.0, pytest.approx(50.0))]


def test_a_slower_pipeline_fails_and_a_missing_one_is_skipped():
    results = [unary(sb.OURS, 64, 0.070, 1000), unary(sb.SEEDS, 64, 0.060, 1000)]
    metrics = by_name(sb.target_metrics(results))
    assert metrics["unary c=64: throughput ours/seeds"].status == "info"
    assert metrics["unary c=64: p99 ours/seeds"].value == pytest.approx(70 / 60)
    assert metrics["unary c=1: p50 ours/seeds"].status == "skip"


def test_time_to_ready_is_judged_against_the_bare_server():
    metrics = sb.ready_metrics(
        {
            "without BLS": {"ours": [2.2, 2.3, 2.1], "floor": [2.0, 2.1, 2.0]},
            "with BLS": {"ours": [3.6], "floor": [3.0]},
        }
    )
    ratios = {m.name: (round(m.value, 3), m.status) for m in metrics if m.unit == "x"}
    assert ratios == {
        "time to ready, without BLS: serve / floor": (1.1, "info"),  # retired on 2 CPUs, with the reason
        "time to ready, with BLS: serve / floor": (1.2, "fail"),
    }


def test_result_rows_and_the_plot_series():
    results = [
        unary(sb.SEEDS, 64, 0.060, 1000),
        unary(sb.OURS, 64, 0.050, 1200),
        unary(sb.OURS, 1, 0.003, 300),
        unary(sb.Pipeline("4 instances", 4, False), 64, 0.05, 1100),
        stream(sb.OURS, "ensemble", 0.0, 0.001),
    ]
    rows = sb.result_metrics(results)
    assert rows[1].name == "serving: ours, unary, 0 ms/token, ensemble, c=64" and rows[1].value == 1200
    assert "p99 50.0 ms" in rows[1].note
    assert rows[-1].unit == "tokens/s" and "ITL p50 1.00 ms" in rows[-1].note
    assert unary_series(results) == {
        "seeds": [(64, 1000.0, pytest.approx(60.0))],
        "ours": [(1, 300.0, pytest.approx(3.0)), (64, 1200.0, pytest.approx(50.0))],
    }


def test_rates_and_milliseconds_read_plainly():
    assert format_value(1130.4, "req/s") == "1130 req/s"
    assert format_value(0.3, "ms") == "0.30 ms"


def test_serving_is_a_suite_of_the_one_command():
    assert selected_suites(["serving"]) == ["serving"]
    assert "serving" in selected_suites(None)
