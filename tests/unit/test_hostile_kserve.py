"""`build.py kserve` refuses up front every value that would only fail later: in the API server, in the HPA, or in
the entrypoint of a pod that then crash-loops."""

from __future__ import annotations

import pytest

from trtllm_entrypoint.errors import UsageError
from trtllm_images.kserve.options import KServeOptions

BASE = {"tag": "25.01", "model_id": "org/model"}


@pytest.mark.parametrize(
    "override",
    [
        {"name": "llm\n"},
        {"namespace": "default\n"},
        {"image": "ghcr.io/org/trtllm-serve:25.01\n"},
        {"registry": "ghcr.io/org\n"},
        {"pvc_name": "cache\n", "cache": "pvc"},
        {"hf_token_secret": "hf-token\n"},
        {"admin_key_secret": "key\n"},
        {"ssh_secret": "ssh\n"},
        {"pvc_size": "100Gi\n", "cache": "pvc"},
        {"prometheus_url": "http://prometheus:9090\n"},
        {"model_id": "org/model\n"},
        {"model_id": "org/../model"},
        {"model_id": "org--x/model"},
        {"model_id": "/mnt/models"},
        {"model_id": "org/model.git"},
        {"model_id": "org/mo${x}del"},
        {"model_id": "just-a-name"},
        {"model_revision": "main\n"},
        {"model_revision": "a b"},
        {"model_id": None, "storage_uri": "s3://bucket/x\n"},
        {"scale_down_window": 3601},
        {"scale_down_window": -1},
        {"min_replicas": 2**31},
        {"max_replicas": 2**31},
        {"max_replicas": 10**20},
        {"nodes": 2**31},
        {"min_replicas": True},
        {"tp_size": True},
        {"scale_target": float("nan")},
    ],
)
def test_values_that_only_fail_later_are_refused_up_front(override):
    with pytest.raises(UsageError, match="invalid KServe options"):
        KServeOptions(**{**BASE, **override})


@pytest.mark.parametrize(
    "override",
    [
        {"scale_down_window": 3600},
        {"scale_down_window": 0},
        {"max_replicas": 2**31 - 1},
        {"model_id": "meta-llama/Llama-3.1-8B-Instruct", "model_revision": "0123abcd" * 5},
        {"model_id": None, "storage_uri": "pvc://models/llama"},
    ],
)
def test_the_limits_themselves_are_allowed(override):
    KServeOptions(**{**BASE, **override})
