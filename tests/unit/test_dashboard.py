"""The Grafana dashboard in deploy/grafana: every query is PromQL that Prometheus' own promtool accepts, and reads only
families the front defines (openai/metrics.py) or that docs/metrics.md lists for Triton's port."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trtllm_entrypoint.openai import metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((REPO / "deploy" / "grafana" / "trtllm-images.json").read_text())
# Grafana's variables, as Grafana substitutes them before the query reaches Prometheus.
GRAFANA = {"$__rate_interval": "1m", "$model_name": ".*"}
SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def queries() -> list[str]:
    found = []
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA.items():
                expr = expr.replace(variable, value)
            found.append(expr)
    return found


def families(expr: str) -> set[str]:
    names = set(re.findall(r"\b((?:vllm:|nv_)[a-z0-9_:]+)", expr))
    return {next((n[: -len(s)] for s in SUFFIXES if n.endswith(s)), n) for n in names}


def test_the_dashboard_reads_the_fronts_families_and_the_documented_triton_ones():
    m = metrics.Metrics(max_model_len=64)
    front = {family.name for family in m.registry.collect()}
    documented = (REPO / "docs" / "metrics.md").read_text()
    used = set().union(*(families(q) for q in queries()))
    assert {f for f in used if f.startswith("vllm:")} <= front
    assert {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:num_requests_waiting"} <= used
    missing = sorted(f for f in used if f.startswith("nv_") and f"`{f}" not in documented)
    assert not missing, f"docs/metrics.md does not list {missing}"
    variables = {v["name"] for v in DASHBOARD["templating"]["list"]}
    assert variables == {"datasource", "model_name"}
    assert all(p.get("datasource", {}).get("uid") == "${datasource}" for p in DASHBOARD["panels"] if p["type"] != "row")


@pytest.mark.process
@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Prometheus' promtool (Debian: prometheus)")
def test_every_query_is_promql_that_promtool_accepts(tmp_path):
    rules = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"q:{i}", "expr": q} for i, q in enumerate(queries())]}]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries())} rules found" in result.stdout
