"""`build.py kserve`'s options (kserve/options.py, kserve/checks.py): bad ones refused with one line naming the
flags, defaults from the option table, and the command line stamped into generated files."""

from __future__ import annotations

import dataclasses
import re
import shlex

import click
import pytest
import yaml

from tests.unit.kserve.kserve_documents import (
    DEPLOY_EXAMPLES,
    HUB_MODEL,
    KNOBS_OPTIONS,
    REPO,
    load_matrix,
)
from trtllm_entrypoint.errors import UsageError
from trtllm_images.kserve import options as kserve_options
from trtllm_images.kserve import plan as kserve


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of --model-id"),
        ({"model_id": HUB_MODEL, "storage_uri": "s3://b/m"}, "exactly one of --model-id"),
        ({"storage_uri": "/data/model"}, "needs a scheme"),
        ({"model_id": HUB_MODEL, "tp_size": 0}, "--tp-size must be a positive integer"),
        ({"model_id": HUB_MODEL, "pp_size": "2"}, "--pp-size must be a positive integer"),
        ({"model_id": HUB_MODEL, "cache": "hostpath"}, "--cache 'hostpath' is not one of emptydir, pvc"),
        ({"model_id": HUB_MODEL, "name": "My_Model"}, "--name 'My_Model' must be a DNS label"),
        ({"model_id": HUB_MODEL, "namespace": "x" * 64}, "--namespace"),
        ({"model_id": HUB_MODEL, "name": "x" * 46}, "longer than 45"),
        ({"model_id": HUB_MODEL, "name": "preprocessing"}, "clashes with a model inside the Triton repository"),
        ({"model_id": HUB_MODEL, "cache": "pvc", "pvc_size": "lots"}, "--pvc-size 'lots'"),
        ({"model_id": HUB_MODEL, "pvc_access_mode": "ReadOnlyMany"}, "--pvc-access-mode"),
        (
            {"model_id": HUB_MODEL, "image": "a/b:c", "registry": "ghcr.io/x"},
            "--image and --registry exclude each other",
        ),
        ({"model_id": HUB_MODEL, "warm_job": True}, "--warm-job needs --cache pvc"),
        ({"storage_uri": "s3://b/m", "cache": "pvc", "warm_job": True}, "pvc:// --storage-uri"),
        ({"model_id": HUB_MODEL, "hf_token_secret": "HF"}, "--hf-token-secret 'HF'"),
        # what the entrypoint or the cluster refused later, after exit 0
        ({"model_id": HUB_MODEL, "tp_size": 3}, "--tp-size must be a power of two"),
        ({"model_id": HUB_MODEL, "tp_size": 128}, "--tp-size must be a power of two"),
        ({"model_id": HUB_MODEL, "pp_size": 65}, "--pp-size must be at most 64"),
        ({"model_id": HUB_MODEL, "name": "1abc"}, "must start with a lowercase letter"),
        (
            {"model_id": HUB_MODEL, "cache": "pvc", "pvc_size": "0"},
            "--pvc-size '0' is not a Kubernetes quantity above zero",
        ),
        ({"model_id": HUB_MODEL, "cache": "pvc", "pvc_size": "0Gi"}, "above zero"),
        ({"storage_uri": "pvc://"}, "must name a PersistentVolumeClaim"),
        ({"storage_uri": "pvc://claim/../etc"}, "may not leave the claim"),
        ({"storage_uri": "pvc://Claim_1/model"}, "must name a PersistentVolumeClaim"),
        ({"model_id": HUB_MODEL, "image": "Bad Image"}, "--image 'Bad Image' is not an image reference"),
        ({"model_id": HUB_MODEL, "image": "ghcr.io/Org/x:1"}, "is not an image reference"),
        (
            {"model_id": HUB_MODEL, "registry": "ghcr.io/my org"},
            "--registry 'ghcr.io/my org' is not an image reference",
        ),
    ],
)
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as info:
        kserve.KServeOptions(tag="25.01", **kwargs)
    assert message in info.value.message and info.value.exit_code == 2


@pytest.mark.parametrize(
    "image",
    [
        "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        "localhost:5000/a/b",
        "registry.example.com/team/llm-server:prod",
        "x@sha256:" + "a" * 64,
    ],
)
def test_good_image_references_are_accepted(image):
    assert kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, image=image).image == image


@pytest.mark.parametrize(
    "args", [["--tp-size", "3"], ["--name", "1abc"], ["--pvc-size", "0", "--cache", "pvc"], ["--image", "Bad Image"]]
)
def test_kserve_command_refuses_bad_options_with_one_line_and_writes_nothing(tmp_path, args):
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    result = CliRunner().invoke(
        cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--out", str(tmp_path / "out"), *args]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: invalid KServe options: ") and result.stderr.count("\n") == 2
    assert not (tmp_path / "out").exists()


def test_command_line_names_only_what_differs_from_the_defaults():
    assert kserve.command_line(kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL)) == (
        f"python build.py kserve --tag 25.01 --model-id {HUB_MODEL}"
    )
    options = kserve.KServeOptions(
        tag="25.01",
        storage_uri="s3://b/m",
        tp_size=2,
        namespaced_runtime=True,
        hf_token_secret=None,
        admin_key_secret=None,
        storage_readonly=False,
    )
    assert kserve.command_line(options) == (
        "python build.py kserve --tag 25.01 --storage-uri s3://b/m --tp-size 2 "
        "--namespaced-runtime --no-hf-token --no-admin-key --storage-writable"
    )


def test_the_cli_takes_its_defaults_from_kserve_options():
    """`build.py kserve` with only the required flags gives KServeOptions' own defaults, and each click option's
    default is its field's: a default is written once, in the dataclass."""
    from trtllm_images.cli import kserve_command

    context = kserve_command.make_context("kserve", ["--tag", "25.01", "--model-id", HUB_MODEL])
    flags = {k: v for k, v in context.params.items() if k not in ("matrix_path", "out_dir")}
    assert kserve_options.from_flags(flags) == kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL)
    for field in dataclasses.fields(kserve.KServeOptions):
        if field.name in ("tag", "model_id"):
            continue
        (option,) = (o for o in kserve_options.OPTIONS if o.field == field.name and not o.clears)
        parsed = flags[option.keyword]
        if isinstance(field.default, bool):  # a switch: given, it flips the field's default
            assert parsed is False, field.name
        elif option.follows:  # left out, the field takes another's value (from_flags above)
            assert parsed is None, field.name
        else:
            assert parsed == field.default, field.name
    assert {o.keyword for o in kserve_options.OPTIONS} == set(flags), "every click option of kserve is in OPTIONS"
    with pytest.raises(click.MissingParameter) as missing:  # a field without a default is a required flag
        kserve_command.make_context("kserve", ["--model-id", HUB_MODEL])
    assert missing.value.param is not None and missing.value.param.name == "tag"


def test_flags_round_trip_through_the_option_table():
    """The command line stamped into generated files (to_flags) parses back into the same options (from_flags)."""
    from trtllm_images.cli import kserve_command

    options = dataclasses.replace(KNOBS_OPTIONS, hf_token_secret=None, admin_key_secret=None, storage_readonly=False)

    context = kserve_command.make_context("kserve", kserve_options.to_flags(options))
    flags = {k: v for k, v in context.params.items() if k not in ("matrix_path", "out_dir")}
    assert kserve_options.from_flags(flags) == options


def test_messages_name_only_flags_that_exist():
    text = (REPO / "trtllm_images" / "kserve" / "checks.py").read_text()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))
    assert named and named <= {o.name for o in kserve_options.OPTIONS}, named - {o.name for o in kserve_options.OPTIONS}


def test_cli_reproduces_the_stamped_command(tmp_path, entry):
    """The command written into each file's header, run through the real CLI, gives the same files."""
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    for options in (*DEPLOY_EXAMPLES.values(), KNOBS_OPTIONS):
        out = tmp_path / str(id(options))
        args = shlex.split(kserve.command_line(options))[2:]  # drop "python build.py"
        result = CliRunner().invoke(cli, [*args, "--out", str(out)])
        assert result.exit_code == 0, result.output
        expected = kserve.render_files(kserve.make_kserve_plan(load_matrix(), options))
        assert {p.name: p.read_text() for p in out.iterdir()} == expected


def test_kserve_command_without_a_registry_warns_that_a_cluster_cannot_pull_the_image():
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    bare = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL])
    given = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--registry", "ghcr.io/o"])
    assert bare.exit_code == 0 and given.exit_code == 0
    [warning] = [line for line in bare.stderr.splitlines() if line.startswith("warning: ")]
    assert "--registry" in warning and "Docker Hub" in warning
    assert "warning" not in given.stderr and "image: ghcr.io/o/trtllm-serve:25.01-" in given.stdout


def test_kserve_command_takes_a_users_own_image(tmp_path):
    from click.testing import CliRunner

    from trtllm_images.cli import cli

    image = "registry.example.com/team/llm-server:prod"
    result = CliRunner().invoke(cli, ["kserve", "--tag", "25.01", "--model-id", HUB_MODEL, "--image", image])
    assert result.exit_code == 0, result.output
    (runtime, *_) = yaml.safe_load_all(result.output)
    assert runtime["spec"]["containers"][0]["image"] == image


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_replicas": 0}, "--max-replicas must be an integer of at least 1"),
        ({"min_replicas": 3, "max_replicas": 2}, "--max-replicas 2 is below --min-replicas 3"),
        ({"scale_target": 0}, "--scale-target must be a ratio"),
        ({"scale_down_window": -1}, "--scale-down-window must be an integer of at least 0"),
        ({"prometheus_url": "prometheus:9090"}, "is not an http(s) URL"),
        ({"nodes": 0}, "nodes must be an integer of at least 1"),
        ({"nodes": 3, "tp_size": 8}, "cannot be split evenly over --nodes 3"),
        ({"nodes": 2, "tp_size": 8, "ssh_secret": "Bad_Name"}, "--ssh-secret 'Bad_Name'"),
    ],
)
def test_bad_scale_out_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as info:
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, **kwargs)
    assert message in info.value.message and info.value.exit_code == 2


BAD_KNOBS = [
    ({"node_selector": ("gpu",)}, "--node-selector 'gpu' is not KEY=VALUE"),
    ({"node_selector": ("bad key=x",)}, "--node-selector 'bad key=x'"),
    ({"tolerations": ("gpu:Sometimes",)}, "--toleration 'gpu:Sometimes' has effect 'Sometimes'"),
    ({"tolerations": ("=x:NoSchedule",)}, "--toleration '=x:NoSchedule' is not KEY[=VALUE][:EFFECT]"),
    ({"affinity": "{nodeAffinity: 1}"}, "--affinity is not JSON"),
    ({"affinity": '{"nodeAffinty": {}}'}, "--affinity has nodeAffinty"),
    ({"affinity": '{"nodeAffinity": []}'}, "--affinity nodeAffinity must be a JSON object"),
    ({"image_pull_secrets": ("Reg_Cred",)}, "--image-pull-secret 'Reg_Cred' must be a DNS subdomain"),
    ({"service_account": "LLM"}, "--service-account 'LLM'"),
    ({"priority_class": "a b"}, "--priority-class 'a b'"),
    ({"env": ("NOVALUE",)}, "--env 'NOVALUE' is not NAME=VALUE"),
    ({"env": ("1X=2",)}, "--env '1X=2' is not NAME=VALUE"),
    ({"env": ("TP_SIZE=4",)}, "--env 'TP_SIZE=4' is set by the generator (use --tp-size)"),
    ({"env": ("CACHE_DIR=/x",)}, "--env 'CACHE_DIR=/x' is set by the generator"),
    ({"env": ("LWS_GROUP_SIZE=2",)}, "is set by the generator"),
    ({"env": ("WANDB_API_KEY=abc",)}, "looks like a secret"),
    ({"env": ("A=1", "A=2")}, "--env A is given twice"),
    ({"cpu": "lots"}, "--cpu 'lots' is not a CPU quantity"),
    ({"cpu": "0"}, "--cpu '0' is not a CPU quantity above zero"),
    ({"memory": "32GB"}, "--memory '32GB' is not a memory quantity"),
    ({"cpu_limit": "2"}, "--cpu-limit 2 is below the request --cpu 4"),
    ({"memory_limit": "16Gi"}, "--memory-limit 16Gi is below the request --memory 32Gi"),
    ({"pvc_storage_class": "nfs"}, "--pvc-storage-class needs --cache pvc"),
    ({"pvc_storage_class": "NFS", "cache": "pvc"}, "--pvc-storage-class 'NFS' must be a DNS subdomain"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_KNOBS)
def test_bad_cluster_settings_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as info:
        kserve.KServeOptions(tag="25.01", model_id=HUB_MODEL, **kwargs)
    assert message in info.value.message and info.value.exit_code == 2, info.value.message


def test_option_errors_name_flags_the_command_has():
    """Every refusal names what the user typed (`--tp-size`), never a field of the options (`tp_size`)."""
    from trtllm_images.cli import cli

    flags = {opt for param in cli.commands["kserve"].params for opt in param.opts}
    cases = [
        {"model_id": HUB_MODEL, "tp_size": 3, "pp_size": 0, "cache": "x", "pvc_access_mode": "x", "frontend": "x"},
        {"storage_uri": "pvc://a/../b", "model_id": HUB_MODEL, "name": "1a", "namespace": "A", "pvc_size": "0"},
        {"model_id": HUB_MODEL, "image": "A B", "registry": "x y", "warm_job": True, "hf_token_secret": "A"},
        {"model_id": HUB_MODEL, "min_replicas": 0, "max_replicas": 0, "nodes": 0, "scale_down_window": -1},
        {"model_id": HUB_MODEL, "scale_target": 0, "prometheus_url": "x", "ssh_secret": "A", "admin_key_secret": "A"},
        {"storage_uri": "s3://b/m", "nodes": 3, "tp_size": 8, "warm_job": True, "cache": "pvc", "name": "a" * 41},
        *(dict(kwargs, model_id=HUB_MODEL) for kwargs, _ in BAD_KNOBS),
    ]
    fields = {f.name for f in dataclasses.fields(kserve.KServeOptions) if "_" in f.name}
    for kwargs in cases:
        with pytest.raises(UsageError) as info:
            kserve.KServeOptions(tag="25.01", **kwargs)
        message = info.value.message
        named = set(re.findall(r"--[a-z][a-z0-9-]*", message))
        assert named and named <= flags, (named - flags, message)
        assert not {field for field in fields if re.search(rf"\b{field}\b", message)}, message
