"""Autoscaling in the generated manifests: opt-in, on Triton's queue/compute ratio over the pipeline's stages
(kserve/scaling.py), the same in Triton and OpenAI mode."""

from __future__ import annotations

import pytest
import yaml

from tests.unit.kserve.kserve_documents import HUB_MODEL, by_kind, documents
from trtllm_images.kserve import plan as kserve
from trtllm_images.kserve import scaling


def test_the_openai_mode_autoscales_on_the_same_signal_as_triton_mode():
    """tritonserver serves its metrics port beside the OpenAI front: the same query, PodMonitor and target."""

    def scaling_documents(frontend):
        docs = documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, frontend=frontend, max_replicas=4))
        service = by_kind(docs, "InferenceService")
        return (
            service["metadata"]["annotations"],
            service["spec"]["predictor"]["autoScaling"],
            by_kind(docs, "PodMonitor"),
        )

    openai, triton = scaling_documents("openai"), scaling_documents("triton")
    assert openai[:2] == triton[:2]
    assert openai[0]["serving.kserve.io/autoscalerClass"] == "keda"
    # The same PodMonitor, which also scrapes the front's LLM metrics on the port KServe routes to it.
    front, monitor = openai[2]["spec"].pop("podMetricsEndpoints"), triton[2]["spec"].pop("podMetricsEndpoints")
    assert openai[2] == triton[2]
    assert front == [*monitor, {"port": "http1", "path": "/metrics", "interval": "15s"}]
    assert monitor == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]


@pytest.mark.parametrize(
    ("args", "replicas", "kinds"),
    [
        ([], (1, 1), ["ClusterServingRuntime", "InferenceService"]),
        (["--min-replicas", "3"], (3, 3), ["ClusterServingRuntime", "InferenceService"]),
        (["--max-replicas", "4"], (1, 4), ["ClusterServingRuntime", "InferenceService", "PodMonitor"]),
        (
            ["--frontend", "openai", "--max-replicas", "3"],
            (1, 3),
            ["ClusterServingRuntime", "InferenceService", "PodMonitor"],
        ),
    ],
)
def test_autoscaling_is_opt_in(tmp_path, args, replicas, kinds):
    """By default a fixed count that runs on KServe alone; --max-replicas above --min-replicas adds KEDA autoscaling
    and the PodMonitor it reads, in either frontend."""
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    result = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, *args])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == kinds
    service = by_kind(docs, "InferenceService")
    predictor = service["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == replicas
    autoscaled = replicas[1] > replicas[0]
    assert ("autoScaling" in predictor) == autoscaled
    assert ("serving.kserve.io/autoscalerClass" in service["metadata"]["annotations"]) == autoscaled


def test_the_service_scales_on_the_queue_compute_ratio_of_its_stages(entry):
    options = kserve.KServeOptions(
        tag="25.01",
        model_id=HUB_MODEL,
        name="chat",
        namespace="team-a",
        min_replicas=2,
        max_replicas=6,
        scale_target=0.5,
        scale_down_window=900,
        prometheus_url="http://prom.obs.svc:9090",
    )
    docs = documents(options)
    isvc = by_kind(docs, "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 6)
    (metric,) = predictor["autoScaling"]["metrics"]
    assert metric["type"] == "External"
    external = metric["external"]
    assert external["metric"]["backend"] == "prometheus"
    assert external["metric"]["serverAddress"] == "http://prom.obs.svc:9090"
    # The formula the real-server test applies to Triton's /metrics, over this service's pods.
    assert external["metric"]["query"] == scaling.query(
        scaling.ENGINE_STAGES, {"namespace": "team-a", "pod": "chat-predictor-.*"}
    )
    assert 'model=~"preprocessing|tensorrt_llm|postprocessing"' in external["metric"]["query"]
    assert external["target"] == {"type": "Value", "value": "500m"}
    assert predictor["autoScaling"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 900}}
    # Prometheus scrapes Triton's metrics port of exactly these pods.
    assert {"name": "metrics", "containerPort": 8002, "protocol": "TCP"} in predictor["model"]["ports"]
    monitor = by_kind(docs, "PodMonitor")
    assert monitor["metadata"]["namespace"] == "team-a"
    assert monitor["spec"]["selector"] == {"matchLabels": {"serving.kserve.io/inferenceservice": "chat"}}
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]


def test_a_fixed_replica_count_renders_no_autoscaler(entry):
    isvc = by_kind(
        documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, min_replicas=3, max_replicas=3)),
        "InferenceService",
    )
    predictor = isvc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (3, 3) and "autoScaling" not in predictor
    assert "serving.kserve.io/autoscalerClass" not in isvc["metadata"]["annotations"]


def test_an_llmapi_image_scales_on_its_one_model(the_matrix):
    """The LLM-API repository has one model, renamed after the service: the ratio is that model's."""
    llmapi = [e for e in the_matrix.supported() if e.default_workflow == "llmapi"]
    if not llmapi:
        pytest.skip("no supported tag defaults to the LLM-API workflow")
    options = kserve.KServeOptions(tag=llmapi[0].tag, model_id=HUB_MODEL, max_replicas=2)
    isvc = by_kind(documents(options), "InferenceService")
    query = isvc["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]["metric"]["query"]
    assert 'model=~"llm"' in query
