"""What a user copies must agree: the README's `docker run`, the compose file and the generated manifests give the
same stop grace (longer than the server's drain) and the same shared-memory size."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from trtllm_entrypoint import contract
from trtllm_entrypoint.config import variables

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
COMPOSE = yaml.safe_load((REPO / "deploy" / "docker-compose.yaml").read_text())["services"]["trtllm"]
SHM_GIB = 8


def manifests() -> list[dict]:
    return [doc for path in sorted((REPO / "deploy").glob("*/*.yaml")) for doc in yaml.safe_load_all(path.read_text())]


def walk(node, key: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item, key)


def readme_docker_runs() -> list[str]:
    return [
        run for block in re.findall(r"```bash\n(.*?)```", README, re.S) for run in re.findall(r"docker run .*", block)
    ]


def test_the_stop_grace_outlasts_the_default_drain_everywhere():
    grace = contract.STOP_GRACE_SECS
    assert variables.VARIABLES["EXIT_TIMEOUT_SECS"].default == contract.DEFAULT_EXIT_TIMEOUT_SECS < grace
    runs = readme_docker_runs()
    assert runs and all(f"--stop-timeout {grace} " in run for run in runs), runs
    assert COMPOSE["stop_grace_period"] == f"{grace}s"
    periods = [v for doc in manifests() for v in walk(doc, "terminationGracePeriodSeconds")]
    assert periods and set(periods) == {grace}, periods


def test_one_shared_memory_size_in_the_readme_the_compose_file_and_the_manifests():
    runs = readme_docker_runs()
    assert runs and all(f"--shm-size={SHM_GIB}g " in run for run in runs), runs
    assert COMPOSE["shm_size"] == f"{SHM_GIB}gb"
    limits = [v["sizeLimit"] for doc in manifests() for v in walk(doc, "emptyDir") if v.get("medium") == "Memory"]
    assert limits and set(limits) == {f"{SHM_GIB}Gi"}, limits
