"""The OpenAI-vs-generate_stream comparison's pure part: which rows, targets and verdicts come from measured runs."""

from __future__ import annotations

import pytest

from benchmarks import openai_bench as ob
from benchmarks.serving_stats import StreamRun


def run(concurrency: int, gap_s: float, tokens: int = 8, requests: int = 10, seconds: float = 1.0) -> StreamRun:
    arrivals = tuple(tuple(r + 0.05 + i * gap_s for i in range(tokens)) for r in range(requests))
    return StreamRun(concurrency, seconds, tuple(float(r) for r in range(requests)), arrivals)


def measured(openai_gap_s: float, openai_seconds: float = 1.0) -> dict:
    runs = {}
    for c in ob.CONCURRENCY:
        runs[(ob.TRITON.name, c)] = [run(c, 0.010)]
        runs[(ob.OPENAI.name, c)] = [run(c, openai_gap_s, seconds=openai_seconds)]
    return {"runs": runs, "ready": {"generate_stream": [1.0, 1.2, 1.1], "openai": [2.0, 2.2, 2.1]}}


def by_name(metrics):
    return {m.name: m for m in metrics}


def test_the_c16_rows_are_the_targets_and_pass_when_the_frontend_adds_little():
    rows = by_name(ob.metrics(measured(0.0105)))
    added = rows["openai vs generate_stream c=16: p50 ITL added"]
    assert added.value == pytest.approx(0.5) and added.status == "pass"
    assert rows["openai vs generate_stream c=16: tokens/s ratio"].status == "pass"
    assert rows["openai vs generate_stream c=1: p50 ITL added"].status == "info"  # c=1: information only
    assert rows["time to ready: openai server (openai: the frontend's /health/ready)"].value == 2.1


def test_a_slower_frontend_fails_both_targets():
    rows = by_name(ob.metrics(measured(0.012, openai_seconds=1.25)))
    assert rows["openai vs generate_stream c=16: p50 ITL added"].status == "fail"
    assert rows["openai vs generate_stream c=16: tokens/s ratio"].value == pytest.approx(0.8)
    assert rows["openai vs generate_stream c=16: tokens/s ratio"].status == "fail"


def test_only_events_with_text_count_as_tokens():
    assert ob.OPENAI.token_of({"choices": [{"text": "a"}]}) and not ob.OPENAI.token_of({"choices": [{"text": ""}]})
    assert ob.TRITON.token_of({"text_output": "a"}) and not ob.TRITON.token_of({"text_output": ""})
