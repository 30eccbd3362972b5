"""The committed deploy/ examples: current with the generator, a Compose file that serves one GPU host, and every
generated environment accepted by the entrypoint."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.image_data import write_image_data
from tests.unit.kserve.kserve_documents import (
    DEPLOY_EXAMPLES,
    REPO,
    documents,
    grid,
    isvc_model,
    load_matrix,
    runtime_container,
)
from trtllm_entrypoint import contract
from trtllm_images.kserve import plan as kserve
from trtllm_images.plan import make_build_plan

DEPLOY = REPO / "deploy"


@pytest.mark.parametrize("folder", sorted(DEPLOY_EXAMPLES))
def test_deploy_files_are_current(entry, folder):
    """deploy/kserve and deploy/multinode are generated; a change in kserve.py must come with regenerated files."""
    options = DEPLOY_EXAMPLES[folder]
    expected = kserve.render_files(kserve.make_kserve_plan(load_matrix(), options))
    directory = DEPLOY / folder
    actual = {p.name: p.read_text(encoding="utf-8") for p in directory.glob("*.yaml")} if directory.is_dir() else {}
    refresh = (
        f"refresh with: {kserve.command_line(options)} --out deploy/{folder} "
        f"(or: python -c 'import tests.unit.kserve.test_kserve_examples as t; t.refresh_deploy()')"
    )
    assert sorted(actual) == sorted(expected), refresh
    for name, text in expected.items():
        assert actual[name] == text, f"deploy/{folder}/{name} is stale; {refresh}"


@pytest.fixture(scope="module")
def compose():
    path = DEPLOY / "docker-compose.yaml"
    return path, yaml.safe_load(path.read_text(encoding="utf-8"))


def test_compose_file_serves_one_gpu_host(compose, entry):
    _, data = compose
    (service,) = data["services"].values()
    # The default image is what `python build.py --tag 25.01` builds locally.
    assert service["image"] == f"${{TRTLLM_IMAGE:-{make_build_plan(entry, out_dir=Path('.')).image('server').ref}}}"
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert service["ports"] == ["8000:8000", "8001:8001", "8002:8002"]  # the image's (Triton's) default ports
    assert service["shm_size"] == "8gb" and service["ulimits"]["memlock"] == -1
    env = service["environment"]
    assert env["MODEL_ID"].startswith("${MODEL_ID:-") and env["CACHE_DIR"] == contract.DEFAULT_CACHE_DIR
    assert env["HF_TOKEN"] is None  # passed through from the caller's environment, never written down
    # The admin key comes from a secrets file the user creates (gitignored), read by the entrypoint from the file.
    assert service["secrets"] == ["triton-admin-key"]
    assert env["TRITON_ADMIN_KEY_FILE"] == "/run/secrets/triton-admin-key" and "TRITON_ADMIN_KEY" not in env
    assert data["secrets"]["triton-admin-key"]["file"].endswith("./triton-admin-key}")
    assert service["volumes"] == [f"trtllm-cache:{contract.DEFAULT_CACHE_DIR}"] and "trtllm-cache" in data["volumes"]
    assert service["stop_grace_period"] == f"{contract.STOP_GRACE_SECS}s" and service["restart"] == "unless-stopped"


def compose_config(path: Path, tmp_path: Path) -> list[str]:
    """Compose v2's `config` over the file, or else v1's (`docker-compose` 1.29, what Debian packages), which
    predates the top-level `name`: it gets the file without it, and the name as its project name."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose", "-f", str(path), "config", "--quiet"]
    v1 = shutil.which("docker-compose")
    if v1 is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed; the structure is checked above")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    name = data.pop("name")
    copy_ = tmp_path / path.name
    copy_.write_text(yaml.safe_dump(data), encoding="utf-8")
    return [v1, "-p", name, "--project-directory", str(path.parent), "-f", str(copy_), "config", "--quiet"]


@pytest.mark.process
def test_compose_config_accepts_the_file(compose, tmp_path):
    path, _ = compose
    result = subprocess.run(compose_config(path, tmp_path), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.process
def test_compose_config_refuses_a_broken_file(compose, tmp_path):
    """The check above can fail: an option Compose does not know is refused."""
    path, data = compose
    broken = copy.deepcopy(data)
    (service,) = broken["services"].values()
    service["ulimit"] = service.pop("ulimits")
    bad = tmp_path / "bad" / path.name
    bad.parent.mkdir()
    bad.write_text(yaml.safe_dump(broken), encoding="utf-8")
    result = subprocess.run(compose_config(bad, tmp_path), capture_output=True, text=True)
    assert result.returncode != 0 and "ulimit" in result.stdout + result.stderr


def _pod_environments(docs):
    """The environment each pod's container gets: runtime env merged with the InferenceService's, or the Job's."""
    runtime = {e["name"]: e.get("value") for e in runtime_container(docs).get("env", []) if "value" in e}
    for doc in docs:
        if doc["kind"] == "InferenceService":
            model = {e["name"]: e["value"] for e in isvc_model([doc]).get("env", []) if "value" in e}
            yield "InferenceService", {**runtime, **model}
        elif doc["kind"] == "Job":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            yield "Job", {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.fixture(scope="module")
def image_facts(entry, tmp_path_factory):
    """What the 25.01 image's entrypoint knows about itself, from the image's data files, made once."""
    from trtllm_entrypoint.config.image_facts import load_facts

    matrix_file = write_image_data(tmp_path_factory.mktemp("image-data"))
    return load_facts({"MATRIX_TAG": entry.tag, "TRTLLM_MATRIX_FILE": str(matrix_file)})


@pytest.mark.parametrize("options", list(grid()))
def test_the_entrypoint_accepts_every_generated_environment(options, image_facts):
    """The manifests and the container's settings validation must agree, or every pod exits 2 at start."""
    from trtllm_entrypoint.config.settings import Settings

    facts = image_facts
    docs = documents(options)
    environments = list(_pod_environments(docs))
    assert [kind for kind, _ in environments] == ["InferenceService"] + (["Job"] if options.warm_job else [])
    for kind, env in environments:
        # KServe fills {{.Name}} with the InferenceService's name before the pod starts.
        env = {k: v.replace("{{.Name}}", options.name) for k, v in env.items()}
        settings = Settings.from_env(env, facts)
        assert settings.tp_size == options.tp_size, kind
        if kind == "InferenceService" and options.frontend == "openai":
            # The OpenAI API on KServe's HTTP port, where the probes ask; nothing else is served.
            assert (settings.frontend, settings.openai_port) == ("openai", 8080)
        elif kind == "InferenceService":
            assert (settings.http_port, settings.grpc_port) == (8080, 8001)


def refresh_deploy() -> None:
    for folder, options in DEPLOY_EXAMPLES.items():
        kserve.write_files(DEPLOY / folder, kserve.render_files(kserve.make_kserve_plan(load_matrix(), options)))
