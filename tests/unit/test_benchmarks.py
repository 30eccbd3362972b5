"""The benchmark harness's pure helpers (no timing here: the numbers themselves belong to `python -m benchmarks`)."""

from __future__ import annotations

import json

import pytest

from benchmarks.entrypoint_bench import phase_seconds
from benchmarks.image_bench import build_steps, layer_steps
from benchmarks.report import Metric, Target, document, evaluate, format_value, median, table
from benchmarks.run import RESULTS_DIR, SUITES, record_path, selected_suites
from benchmarks.sandbox import json_events


def test_median_of_odd_and_even_counts():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


@pytest.mark.parametrize(
    "value,target,expected",
    [
        (0.4, Target("<", 1.0, "s"), "pass"),
        (1.0, Target("<", 1.0, "s"), "fail"),
        (1.2, Target("<=", 1.2, "x"), "pass"),
        (2, Target("==", 1), "fail"),
        (None, Target("<", 1.0), "skip"),
        (3.5, None, "info"),
    ],
)
def test_evaluate_against_target(value, target, expected):
    assert evaluate(value, target) == expected


def test_unknown_comparison_is_refused():
    with pytest.raises(ValueError, match="allowed"):
        Target("~", 1.0)


def test_values_are_formatted_by_unit():
    assert format_value(0.25, "s") == "0.250 s"
    assert format_value(1.234, "x") == "1.23x"
    assert format_value(389_100, "B") == "389.1 kB"
    assert format_value(3, "") == "3"
    assert format_value(None, "s") == "-"


def test_table_has_aligned_columns_status_and_notes():
    metrics = [
        Metric("warm start", 0.3, "s", Target("<", 1.0, "s")),
        Metric("ratio", 1.5, "x", Target("<=", 1.3, "x"), note="CPU-bound on 2 cores"),
        Metric("images: skipped", None, note="no Docker engine"),
    ]
    lines = table(metrics).splitlines()
    assert lines[0].split(" | ")[0].strip() == "metric"
    assert len({line.index("|") for line in lines[:5] if "|" in line}) == 1  # one column edge for every row
    assert "0.300 s" in lines[2] and lines[2].endswith("pass")
    assert lines[3].endswith("fail") and lines[4].endswith("skip")
    assert "  ratio: CPU-bound on 2 cores" in lines and "  images: skipped: no Docker engine" in lines


def test_document_lists_failures_and_is_json():
    doc = document(
        [Metric("a", 0.5, "s", Target("<", 1.0, "s")), Metric("b", 3.0, "s", Target("<", 2.0, "s"))],
        machine={"nproc": 2},
        settings={"quick": True},
    )
    assert doc["failed"] == ["b"] and doc["ok"] is False
    assert json.loads(json.dumps(doc))["metrics"][1]["target"] == "< 2.000 s"


def test_phase_and_step_durations_come_from_json_log_events():
    stderr = "\n".join(
        [
            json.dumps({"ts": 1.0, "level": "info", "msg": "phase done", "phase": "resolve", "seconds": 0.01}),
            "I0000 tritonserver double: serving models ensemble",  # not ours: skipped
            json.dumps({"ts": 2.0, "level": "info", "msg": "step done", "step": "trtllm-build", "seconds": 2.0}),
            json.dumps({"ts": 2.1, "level": "info", "msg": "phase done", "phase": "engine", "seconds": 2.1}),
        ]
    )
    events = json_events(stderr)
    assert len(events) == 3
    assert phase_seconds(events) == {"resolve": [0.01], "trtllm-build": [2.0], "engine": [2.1]}


def test_build_steps_mark_cache_hits_and_skip_arg_and_from():
    output = [
        "Step 1/5 : ARG BASE_IMAGE=x",
        "Step 2/5 : FROM ${BASE_IMAGE}",
        " ---> 0e2c71392054",
        "Step 3/5 : ENV A=1",
        " ---> Using cache",
        " ---> 1234",
        "Step 4/5 : COPY wheels/ /tmp/wheels/",
        " ---> 5678",
        "Step 5/5 : USER 1000",
        " ---> Running in abc",
    ]
    steps = layer_steps(build_steps(output))
    assert [(s.instruction, s.cached) for s in steps] == [
        ("ENV A=1", True),
        ("COPY wheels/ /tmp/wheels/", False),
        ("USER 1000", False),
    ]


def test_concurrent_suite_brings_the_cold_start_it_is_compared_with():
    assert selected_suites(["concurrent"]) == ["cold", "concurrent"]
    assert selected_suites(None) == ["warm", "cold", "concurrent", "images", "static", "serving", "scaling", "openai"]


def test_a_recorded_run_is_one_file_named_by_its_start_and_suites():
    import datetime

    at = datetime.datetime(2026, 11, 28, 3, 7, tzinfo=datetime.timezone.utc)
    assert record_path(list(SUITES), at) == RESULTS_DIR / "2026-11-28-0307-all.json"
    assert record_path(["serving", "openai"], at).name == "2026-11-28-0307-serving+openai.json"
    assert RESULTS_DIR.is_dir() and any(RESULTS_DIR.glob("2026-*")), "past runs live there, not in the docs' prose"
