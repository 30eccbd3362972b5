"""`build.py kserve --adapters pvc://claim[/path]`: the adapters' claim mounted read-only where LORA_DIR points, in the
service and the warm Job (which converts them as the service would), valid against KServe's and Kubernetes' own
schemas; refused with one line where the tag cannot serve adapters or the URI is not a claim."""

from __future__ import annotations

import pytest

from tests.unit.kserve.kserve_documents import HUB_MODEL, builtin_errors, by_kind, documents, validation_errors
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import UsageError
from trtllm_images.kserve import plan as kserve


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in container["env"]}


def test_the_adapters_claim_is_mounted_read_only_for_lora_dir_in_the_service_and_the_warm_job(crd_validators):
    options = kserve.KServeOptions(
        tag="25.05", model_id=HUB_MODEL, adapters="pvc://team-loras/llama", cache="pvc",
        pvc_access_mode="ReadWriteMany", warm_job=True, frontend="openai",
    )  # fmt: skip
    docs = documents(options)
    isvc, job = by_kind(docs, "InferenceService"), by_kind(docs, "Job")
    predictor, pod = isvc["spec"]["predictor"], job["spec"]["template"]["spec"]
    for spec, container in ((predictor, predictor["model"]), (pod, pod["containers"][0])):
        assert {"name": "lora-adapters", "persistentVolumeClaim": {"claimName": "team-loras", "readOnly": True}} in (
            spec["volumes"]
        )
        mount = next(m for m in container["volumeMounts"] if m["name"] == "lora-adapters")
        assert mount == {"name": "lora-adapters", "mountPath": "/mnt/adapters", "readOnly": True, "subPath": "llama"}
        assert env_of(container)["LORA_DIR"] == contract.KSERVE_ADAPTERS_DIR == mount["mountPath"]
        assert env_of(container)["WORKFLOW"] == "engine"
    for doc in docs:
        assert validation_errors(doc, crd_validators) == [], doc["kind"]
    assert builtin_errors(job) == []


def test_without_adapters_nothing_changes():
    docs = documents(kserve.KServeOptions(tag="25.05", model_id=HUB_MODEL))
    predictor = by_kind(docs, "InferenceService")["spec"]["predictor"]
    assert "LORA_DIR" not in env_of(predictor["model"]) and all(
        v["name"] != "lora-adapters" for v in predictor["volumes"]
    )


def test_a_tag_without_adapters_is_refused_naming_the_first_that_has_them():
    with pytest.raises(UsageError) as refused:
        documents(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, adapters="pvc://loras"))
    assert "25.01's backend cannot serve LoRA adapters" in str(refused.value) and "--tag 25.05" in refused.value.hint


@pytest.mark.parametrize(
    ("adapters", "extra", "expected"),
    [
        ("s3://bucket/loras", {}, "--adapters 's3://bucket/loras' must name a PersistentVolumeClaim"),
        ("pvc://loras/../other", {}, "may not leave the claim"),
        ("pvc://loras", {"nodes": 2, "tp_size": 2}, "--adapters serves on one node"),
    ],
)
def test_adapters_that_are_not_a_claim_are_refused_when_the_options_are_made(adapters, extra, expected):
    with pytest.raises(UsageError, match="invalid KServe options") as refused:
        kserve.KServeOptions(tag="25.05", model_id=HUB_MODEL, adapters=adapters, **extra)
    assert expected in str(refused.value)
