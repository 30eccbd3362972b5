"""What a user copies must agree: the README's `docker run`, the compose file and the generated manifests give the
same stop grace (longer than the server's drain) and the same shared-memory size."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from trtllm_entrypoint import contract
from trtllm_entrypoint.config import variables
from trtllm_entrypoint.contract import is_hub_id

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
COMPOSE = yaml.safe_load((REPO / "deploy" / "docker-compose.yaml").read_text())["services"]["trtllm"]
SHM_GIB = contract.SHM_SIZE_GIB


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


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Modes that run once and exit (docs/container.md): nothing streams when they are stopped.
ONE_SHOT = {"prepare", "check", "probe", "flags", "health", "build-engine"}


@dataclass(frozen=True)
class DockerRun:
    page: str
    text: str  # the command, continuation lines joined
    options: list[str]  # what comes before the image
    image: str
    args: list[str]  # what comes after it

    def values(self, flag: str) -> list[str]:
        """Every value given to `flag` (`--flag V` or `--flag=V`)."""
        out = []
        for i, word in enumerate(self.options):
            if word == flag and i + 1 < len(self.options):
                out.append(self.options[i + 1])
            elif word.startswith(flag + "="):
                out.append(word.split("=", 1)[1])
        return out

    def env(self) -> dict[str, str | None]:
        """-e NAME=VALUE, or -e NAME (passed through from the caller): None."""
        pairs = (value.partition("=") for value in self.values("-e") + self.values("--env"))
        return {name: (value if sep else None) for name, sep, value in pairs}

    @property
    def serves(self) -> bool:
        return not (set(self.args[:1]) & ONE_SHOT) and "trtllm-builder" not in self.image


# docker run's options that take a value, as far as the documented commands use them.
VALUED = {"-p", "-v", "-e", "--env", "--shm-size", "--stop-timeout", "--gpus", "--name", "--user", "--tmpfs", "-u"}


def documented_docker_runs() -> list[DockerRun]:
    """Every `docker run` in a bash block of the README and docs/, as a user would paste it."""
    runs = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for command in block.replace("\\\n", " ").splitlines():
                if "docker run " not in command:
                    continue
                words = shlex.split(command.split("docker run ", 1)[1], comments=True)
                i = 0
                while i < len(words) and words[i].startswith("-"):
                    i += 2 if words[i] in VALUED else 1
                runs.append(DockerRun(page.name, command.strip(), words[:i], words[i], words[i + 1 :]))
    return runs


def readme_docker_runs() -> list[str]:
    return [run.text + " " for run in documented_docker_runs() if run.page == "README.md"]


def test_every_documented_docker_run_is_copy_paste_safe():
    """Each stops cleanly with a stream in flight (a stop timeout longer than its drain), carries the shared-memory
    size, passes HF_TOKEN where its model comes from the hub, and asks for a GPU unless it runs a stand-in."""
    runs = documented_docker_runs()
    assert {run.page for run in runs} >= {"README.md", "no-gpu.md", "openai.md", "container.md"}
    problems = []
    for run in runs:
        env = run.env()
        where = f"{run.page}: {run.text}"
        if run.values("--shm-size") != [f"{contract.SHM_SIZE_GIB}g"]:
            problems.append(f"--shm-size={contract.SHM_SIZE_GIB}g missing: {where}")
        drain = int(env.get("EXIT_TIMEOUT_SECS") or contract.DEFAULT_EXIT_TIMEOUT_SECS)
        margin = contract.STOP_GRACE_SECS - contract.DEFAULT_EXIT_TIMEOUT_SECS
        stop = run.values("--stop-timeout")
        if run.serves and (len(stop) != 1 or int(stop[0]) < drain + margin):
            problems.append(f"--stop-timeout must outlast the drain ({drain} s) by {margin} s: {where}")
        model = env.get("MODEL_ID") or ""
        if is_hub_id(model) and not {"HF_TOKEN", "HF_TOKEN_FILE"} & set(env):
            problems.append(f"a hub model (gated ones need the token): -e HF_TOKEN missing: {where}")
        answering = {contract.DEFAULT_HTTP_PORT, contract.DEFAULT_GRPC_PORT, contract.DEFAULT_METRICS_PORT}
        if "openai" in run.text.lower():
            answering.add(contract.DEFAULT_OPENAI_PORT)
        published = {int(value.rsplit(":", 1)[-1]) for value in run.values("-p")}
        if published - answering:
            problems.append(f"publishes {sorted(published - answering)}, where nothing answers: {where}")
        standin = run.image.endswith("-standin")
        if standin == bool(run.values("--gpus")):
            problems.append(f"{'a stand-in needs no' if standin else 'a real image needs'} --gpus: {where}")
    assert not problems, "\n".join(problems)


def test_the_documented_flags_are_found():
    """The parser above reads what the README's quick start says."""
    [first, *_] = [run for run in documented_docker_runs() if run.page == "README.md"]
    assert first.image == "trtllm-serve:25.01-trtllm-0.17.0" and first.values("--stop-timeout") == ["40"]
    assert first.env() == {"MODEL_ID": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "HF_TOKEN": None}


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
