"""The serving benchmark's load generator against the REAL tritonserver (harness/realtriton.py) on a repository our
entrypoint prepared: every request it counts was answered in full, streamed token by token, and the engine double
streams concurrent requests side by side (in-flight batching), not one after the other."""

from __future__ import annotations

import pytest

from benchmarks import serving_bench as sb
from harness.build_standin import TemplatesMissing

serving_load = pytest.importorskip("benchmarks.serving_load")  # needs tritonclient[grpc]


@pytest.fixture
def bench(tmp_path, real_triton):
    try:
        return sb.Bench(tmp_path, real_triton)
    except TemplatesMissing as exc:
        pytest.skip(str(exc))


def serve(bench, decoupled, delay_s):
    env = bench.env(sb.OURS, decoupled, TRTLLM_ENGINE_DOUBLE_TOKEN_DELAY_S=str(delay_s))
    proc = sb.start_server(bench.prepare(env), env, bench.work / "server.log")
    try:
        sb.wait_ready(f"http://127.0.0.1:{env['HTTP_PORT']}", proc, timeout_s=120)
    except RuntimeError:
        sb.stop(proc)
        raise
    return proc, f"127.0.0.1:{env['GRPC_PORT']}"


def test_unary_load_counts_answered_requests(bench):
    proc, url = serve(bench, decoupled=False, delay_s=0)
    try:
        run = serving_load.unary(url, "ensemble", 4, warmup_s=0.2, measure_s=1.0)
    finally:
        sb.stop(proc)
    assert run.errors == 0 and len(run.latencies_s) > 10
    assert all(0 < latency < 1.0 for latency in run.latencies_s)


def test_streams_deliver_every_token_and_advance_together(bench):
    delay_s = 0.02
    proc, url = serve(bench, decoupled=True, delay_s=delay_s)
    try:
        run = serving_load.streaming(url, "ensemble", 4, warmup_s=0.2, measure_s=1.5)
    finally:
        sb.stop(proc)
    assert run.errors == 0 and run.sent_s
    assert {len(tokens) for tokens in run.arrivals_s} == {serving_load.MAX_TOKENS}
    # Four streams side by side: each gets a token per engine step, so the gaps stay near one delay (taking turns
    # would make the first token wait for the other streams: several times 16 x delay).
    assert sorted(run.itl_s)[len(run.itl_s) // 2] < 2 * delay_s
    assert max(run.ttft_s) < serving_load.MAX_TOKENS * delay_s
