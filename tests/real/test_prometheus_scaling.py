"""The autoscaling query of the generated manifests, evaluated by a REAL Prometheus scraping the REAL tritonserver.

Real: Debian's `prometheus` (2.42), tritonserver 2.51 with its scheduler queue and counters, the repository our
entrypoint filled, and the query text as `build.py kserve` writes it (read back from the rendered YAML). The engine
double only decides how long one request takes; capacity is one request in flight (tests/unit/test_scaling_signal.py
measures the same server directly).

On a cluster the Prometheus Operator's PodMonitor labels every sample with its pod's `namespace` and `pod`. Here one
scrape job per manifest sets those two labels on the server's metrics port, with the values a pod of that manifest
has (a raw deployment's `<name>-predictor-<hash>-<hash>`, a LeaderWorkerSet leader's `<name>-<group>`), so the query's
matchers select it unchanged. Scrapes run every second; the query's window stays the manifest's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from benchmarks import scaling_signal
from harness import realtriton
from harness.image import KEY, Image, prepared_argv, templates_for
from trtllm_images import matrix
from trtllm_images.kserve import plan as kserve

HUB_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
SERVICE = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, namespace="serving", max_replicas=4)
GROUP = kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, namespace="serving", nodes=2, tp_size=16, max_replicas=4)
# The pod each manifest's autoscaler reads: a raw deployment's replica, a group's leader (group 0).
PODS = {"InferenceService": "llm-predictor-7c9f8d6b5-k2x9q", "ScaledObject": "llm-0"}
STEP_S = 8  # seconds of each load step before the query is evaluated (several 1 s scrapes)


def manifest_queries() -> dict[str, tuple[str, float]]:
    """Kind -> (query, target), read from the YAML `build.py kserve` prints, as a user's files carry them."""
    found = {}
    for options in (SERVICE, GROUP):
        for doc in yaml.safe_load_all(kserve.render_manifests(kserve.make_kserve_plan(matrix.load(), options))):
            if doc["kind"] == "InferenceService":
                external = doc["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]
                found["InferenceService"] = (external["metric"]["query"], quantity(external["target"]["value"]))
            elif doc["kind"] == "ScaledObject":
                trigger = doc["spec"]["triggers"][0]["metadata"]
                found["ScaledObject"] = (trigger["query"], float(trigger["threshold"]))
    return found


def quantity(text: str) -> float:
    """A Kubernetes quantity as the manifests write a ratio: "1", "500m"."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    found = shutil.which("prometheus")
    if found is None:
        message = "Debian's `prometheus` is not installed (apt-get install prometheus; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, so a real Prometheus must run: {message}")
        pytest.skip(message)
    return Path(found)


@contextlib.contextmanager
def prometheus(binary: Path, work: Path, metrics_port: int) -> Iterator[str]:
    """Prometheus scraping 127.0.0.1:`metrics_port` every second, once per manifest with that manifest's pod labels;
    yields its API URL once both targets have been scraped."""
    jobs = [
        {
            "job_name": f"podmonitor/serving/llm-triton/{kind}",
            "scrape_interval": "1s",
            "static_configs": [
                {"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"namespace": "serving", "pod": pod}}
            ],
        }
        for kind, pod in PODS.items()
    ]
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))
    port = realtriton.free_port()
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115 (closed below, after the process)
    argv = [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and up_targets(url) < len(jobs):
            assert process.poll() is None, (work / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        assert up_targets(url) == len(jobs), (work / "prometheus.log").read_text()[-3000:]
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def api(url: str, path: str, **params: str) -> dict:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def up_targets(url: str) -> int:
    try:
        targets = api(url, "/api/v1/targets", state="active")["activeTargets"]
    except OSError:
        return 0
    return sum(target["health"] == "up" for target in targets)


def evaluate(url: str, query: str) -> float:
    """The query's value now: one sample, as KEDA's Prometheus scaler reads it."""
    result = api(url, "/api/v1/query", query=query)
    assert result["resultType"] == "vector" and len(result["result"]) == 1, result
    return float(result["result"][0]["value"][1])


def test_a_real_prometheus_evaluates_the_manifests_query_below_target_at_one_client_above_it_overloaded(
    tmp_path, real_triton, prometheus_binary
):
    queries = manifest_queries()
    assert set(queries) == set(PODS)
    image = Image(tmp_path, "25.01", templates_for("v0.17.0"))
    argv = scaling_signal.engine_only(prepared_argv(image, KEY, **scaling_signal.server_settings()))
    metrics_port = int(next(a.split("=", 1)[1] for a in argv if a.startswith("--metrics-port=")))
    values: dict[str, dict[str, float]] = {kind: {} for kind in queries}
    with (
        realtriton.start(real_triton, argv, env=scaling_signal.server_env(), log_dir=tmp_path) as server,
        prometheus(prometheus_binary, tmp_path, metrics_port) as url,
    ):
        time.sleep(3)  # a few idle scrapes: rate() needs two samples in its window
        for kind, (query, _) in queries.items():
            values[kind]["idle"] = evaluate(url, query)
        # One client, then twelve: each step's value read while its load still runs. The window (1m) reaches back
        # into the step before, which adds compute but no queueing: it can only lower the overloaded value.
        for step, clients in (("one client", 1), ("overloaded", 12)):
            with scaling_signal.closed_loop(server.http_url, clients) as load:
                time.sleep(STEP_S)
                for kind, (query, _) in queries.items():
                    values[kind][step] = evaluate(url, query)
            assert len(load.latencies) >= 5, (step, len(load.latencies))
        assert server.stop() == 0, server.log()[-3000:]

    for kind, (_, target) in queries.items():
        seen = values[kind]
        assert seen["idle"] == 0.0, (kind, seen)  # clamp_min: an idle server gives 0, never NaN or no value
        assert seen["one client"] < target < seen["overloaded"], (kind, target, seen)
    # Both manifests carry the same formula over their own pods: on the same server they read nearly the same value
    # (their scrape jobs sample it at different instants).
    assert values["InferenceService"] == pytest.approx(values["ScaledObject"], rel=0.2, abs=0.02)
