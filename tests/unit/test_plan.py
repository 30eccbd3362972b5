"""plan.make_build_plan: image refs, labels, base image, context location, refusal of unsupported entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import factories
from trtllm_entrypoint.errors import UsageError
from trtllm_images.checks import REQUIRED_LABELS
from trtllm_images.matrix import Backend
from trtllm_images.plan import make_build_plan

OUT = Path("/nonexistent/out")


entry = factories.matrix_entry


def test_refs_name_the_ngc_tag_and_tensorrt_llm_version():
    plan = make_build_plan(entry(), out_dir=OUT)
    assert [(i.kind, i.ref, i.dockerfile) for i in plan.images] == [
        ("server", "trtllm-serve:25.01-trtllm-0.17.0", "server.Dockerfile"),
        ("builder", "trtllm-builder:25.01-trtllm-0.17.0", "builder.Dockerfile"),
    ]
    assert plan.image("builder").ref == "trtllm-builder:25.01-trtllm-0.17.0"


def test_multinode_adds_the_group_image_after_the_server_it_is_built_from():
    plan = make_build_plan(entry(), registry="ghcr.io/acme", out_dir=OUT, multinode=True)
    assert [(i.kind, i.ref) for i in plan.images] == [
        ("server", "ghcr.io/acme/trtllm-serve:25.01-trtllm-0.17.0"),
        ("builder", "ghcr.io/acme/trtllm-builder:25.01-trtllm-0.17.0"),
        ("group", "ghcr.io/acme/trtllm-serve-group:25.01-trtllm-0.17.0"),
    ]
    assert plan.image("group").labels["org.opencontainers.image.title"] == "trtllm-serve-group"
    assert plan.group_packages == ("openssh-client", "openssh-server")


@pytest.mark.parametrize("registry", ["ghcr.io/acme", "ghcr.io/acme/", "localhost:5000/team/sub"])
def test_registry_prefixes_every_ref(registry):
    plan = make_build_plan(entry(tensorrt_llm="0.17.0.post1"), registry=registry, out_dir=OUT)
    prefix = registry.rstrip("/")
    assert [i.ref for i in plan.images] == [
        f"{prefix}/trtllm-serve:25.01-trtllm-0.17.0.post1",
        f"{prefix}/trtllm-builder:25.01-trtllm-0.17.0.post1",
    ]


@pytest.mark.parametrize("registry", ["GHCR.io/Acme", "ghcr.io//x", "has space"])
def test_malformed_registry_is_a_usage_error(registry):
    with pytest.raises(UsageError, match="--registry"):
        make_build_plan(entry(), registry=registry, out_dir=OUT)


def test_labels_carry_every_matrix_version_and_no_revision_by_default():
    labels = make_build_plan(entry(), out_dir=OUT).image("server").labels
    assert set(REQUIRED_LABELS) <= set(labels)
    assert labels["io.trtllm-images.ngc-tag"] == "25.01"
    assert labels["io.trtllm-images.tensorrt-llm"] == "0.17.0"
    assert labels["io.trtllm-images.tensorrt"] == "10.8.0.43"
    assert labels["io.trtllm-images.backend-ref"] == "v0.17.0"
    assert labels["org.opencontainers.image.version"] == "25.01-trtllm-0.17.0"
    assert not any("revision" in key or "created" in key for key in labels)
    assert make_build_plan(entry(), out_dir=OUT).image("server").revision_labels == {}


def test_revision_label_is_its_own_last_instruction():
    plan = make_build_plan(entry(), out_dir=OUT, revision="0123abc")
    for spec in plan.images:
        assert spec.revision_labels == {"org.opencontainers.image.revision": "0123abc"}
        assert "org.opencontainers.image.revision" not in spec.labels


@pytest.mark.parametrize("revision", ['abc"def', "a$b", "a\\nb"])
def test_unquotable_revision_is_a_usage_error(revision):
    with pytest.raises(UsageError, match="revision"):
        make_build_plan(entry(), out_dir=OUT, revision=revision)


def test_unknown_versions_are_labelled_unknown_and_workflows_joined():
    labels = make_build_plan(entry(pytorch=None, workflows=("engine", "llmapi")), out_dir=OUT).image("builder").labels
    assert labels["io.trtllm-images.pytorch"] == "unknown"
    assert labels["io.trtllm-images.workflows"] == "engine,llmapi"


def test_each_image_has_its_title_first_and_shares_the_rest():
    plan = make_build_plan(entry(), out_dir=OUT, revision="abc")
    server, builder = plan.image("server").labels, plan.image("builder").labels
    assert list(server)[:2] == ["org.opencontainers.image.title", "org.opencontainers.image.description"]
    assert server["org.opencontainers.image.title"] == "trtllm-serve"
    assert builder["org.opencontainers.image.title"] == "trtllm-builder"
    assert list(server) == list(builder)
    assert {k: v for k, v in server.items() if "title" not in k and "description" not in k} == {
        k: v for k, v in builder.items() if "title" not in k and "description" not in k
    }


def test_base_image_override_is_a_build_arg_that_the_base_name_label_follows():
    default = make_build_plan(entry(), out_dir=OUT)
    assert default.base_image == default.entry.base_image
    plan = make_build_plan(
        entry(), base_image="registry.example/mirror/tritonserver:25.01-trtllm-python-py3", out_dir=OUT
    )
    assert plan.base_image == "registry.example/mirror/tritonserver:25.01-trtllm-python-py3"
    assert plan.buildargs == {"BASE_IMAGE": "registry.example/mirror/tritonserver:25.01-trtllm-python-py3"}
    assert plan.image("server").labels["org.opencontainers.image.base.name"] == "${BASE_IMAGE}"
    assert plan.images == default.images


@pytest.mark.parametrize("base", ["", "two words", 'quote"d'])
def test_bad_base_image_is_a_usage_error(base):
    with pytest.raises(UsageError):
        make_build_plan(entry(), base_image=base, out_dir=OUT)


def test_backend_assets_needed_only_without_app_and_context_dir_per_tag(tmp_path):
    old = entry(
        tag="24.08",
        tensorrt_llm="0.12.0",
        backend=Backend("triton-inference-server/tensorrtllm_backend", "v0.12.0", "", False),
    )
    assert make_build_plan(old, out_dir=tmp_path).needs_backend_assets is True
    assert make_build_plan(entry(), out_dir=tmp_path).needs_backend_assets is False
    assert make_build_plan(old, out_dir=tmp_path).context_dir == tmp_path / "context" / "24.08"
    assert list(tmp_path.iterdir()) == []  # planning writes nothing


def test_unsupported_entry_is_refused_with_its_note():
    with pytest.raises(UsageError, match="no tensorrt_llm package") as info:
        make_build_plan(
            entry(tag="24.03", status="unsupported", note="the image has no tensorrt_llm package"), out_dir=OUT
        )
    assert info.value.exit_code == 2


def test_entry_without_tensorrt_llm_version_is_refused():
    with pytest.raises(UsageError, match="no TensorRT-LLM version"):
        make_build_plan(entry(tensorrt_llm=None), out_dir=OUT)


def test_label_values_with_quotes_are_refused():
    with pytest.raises(UsageError, match="label"):
        make_build_plan(entry(), revision='abc"; RUN x', out_dir=OUT)


@pytest.mark.parametrize(
    "base, standin",
    [
        ("trtllm-standin:25.01", True),
        ("localhost:5000/ci/trtllm-standin-old:24.08", True),
        ("nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3", False),
        ("mirror.example/trtllm-standins-are-not-here/tritonserver:25.01", False),
    ],
)
def test_images_built_from_a_stand_in_say_so_in_their_tag(base, standin):
    plan = make_build_plan(entry(), base_image=base, out_dir=Path("/tmp/out"))
    assert plan.standin is standin
    assert all(spec.ref.endswith("-standin") is standin for spec in plan.images), [s.ref for s in plan.images]
