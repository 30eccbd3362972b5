"""A multi-node group with Docker: two containers of our server image on the test's own user-defined network, their
network aliases the names LeaderWorkerSet gives its pods, the LWS variables set as LWS sets them.

Real: the group image `build.py --multinode` makes, the entrypoint in both roles, Open MPI's mpirun and orted spanning
the two containers over ssh (OpenSSH's client and an unprivileged sshd, the group's key from a mounted directory as a
Secret would be), and tritonserver 2.51 on each rank.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid

import pytest

from harness.doubles import read_records
from harness.tiny_checkpoint import PROMPT, PROMPT_WORDS
from tests.docker.conftest import logs, record_mount
from tests.docker.test_e2e import NEW_TAG

ONE_GPU = "NVIDIA H100 80GB HBM3|9.0|81559"
LEADER, WORKER = "llm-0.llm.default", "llm-0-1.llm.default"  # <set>-<group>[.-<index>].<subdomain>.<namespace>


@pytest.fixture(scope="module")
def group_image(built):
    """`build.py --tag 25.01 --multinode`: the group image, the server plus OpenSSH from the base's apt archives."""
    return built(NEW_TAG, multinode=True).image("group")


@pytest.fixture
def network(docker_client):
    net = docker_client.networks.create(f"trtllm-e2e-lws-{uuid.uuid4().hex[:8]}", driver="bridge")
    yield net
    net.remove()


@pytest.fixture
def group_key(tmp_path, group_image, docker_client):
    """The group's key pair, made by ssh-keygen in the image; readable by the container user, as a Secret is."""
    directory = tmp_path / "mpi-ssh"
    directory.mkdir()
    directory.chmod(0o777)
    docker_client.containers.run(
        group_image,
        entrypoint=["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "group", "-f", "/keys/id_ed25519"],
        volumes={str(directory): {"bind": "/keys", "mode": "rw"}},
        remove=True,
    )
    for path in directory.iterdir():
        path.chmod(0o644)
    return directory


def start_pod(client, started, image, network, *, index, alias, model, records, cache, key_dir, **extra_env):
    env = {
        "MODEL_ID": "/models/tiny",
        "DOUBLE_RECORD_DIR": "/records",
        "TP_SIZE": "2",
        "NVIDIA_SMI_DOUBLE_GPUS": ONE_GPU,
        "LWS_LEADER_ADDRESS": LEADER,
        "LWS_GROUP_SIZE": "2",
        "LWS_WORKER_INDEX": str(index),
        **extra_env,
    }
    volumes = {
        str(model): {"bind": "/models/tiny", "mode": "ro"},
        cache: {"bind": "/var/cache/trtllm", "mode": "rw"},
        str(key_dir): {"bind": "/etc/trtllm-images/mpi-ssh", "mode": "ro"},
        **record_mount(records),
    }
    container = client.containers.create(
        image, environment=env, volumes=volumes, hostname=alias.split(".")[0], network=network.name
    )
    started.append(container)
    # Before it starts: on the test's network, the alias is the name LWS's headless Service gives the pod.
    network.disconnect(container)
    network.connect(container, aliases=[alias])
    container.start()
    return container


def ip_of(container, network) -> str:
    container.reload()
    return container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]


def wait_ready(container, network, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        if container.status not in ("created", "running"):
            pytest.fail(f"leader exited ({container.attrs['State']['ExitCode']}):\n{logs(container)}")
        try:
            with urllib.request.urlopen(f"http://{ip_of(container, network)}:8000/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"leader not ready within {timeout_s}s:\n{logs(container)[-6000:]}")


def generate(container, network) -> list[str]:
    body = json.dumps({"text_input": PROMPT, "max_tokens": 4, "bad_words": "", "stop_words": ""}).encode()
    url = f"http://{ip_of(container, network)}:8000/v2/models/ensemble/generate"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as response:
        words = json.loads(response.read())["text_output"].split()
    assert len(words) == 4 and set(words) <= set(PROMPT_WORDS), words
    return words


def wait_exit(container, timeout_s=90) -> int:
    return container.wait(timeout=timeout_s)["StatusCode"]


def processes(container) -> list[str]:
    return [row[1] for row in container.top(ps_args="-o pid,args")["Processes"]]


@pytest.fixture
def group(docker_client, group_image, network, tiny_model, records, cache_volume, group_key):
    started: list = []

    def start(index, alias, **env):
        return start_pod(
            docker_client,
            started,
            group_image,
            network,
            index=index,
            alias=alias,
            model=tiny_model,
            records=records,
            cache=cache_volume,
            key_dir=group_key,
            **env,
        )

    yield start
    for container in started:
        try:
            container.remove(force=True)
        except Exception as exc:  # already gone
            print(f"cleanup of {container.short_id}: {exc}")


def test_two_pods_serve_one_model_and_sigterm_to_the_leader_stops_both(group, network, records):
    worker = group(1, WORKER)
    leader = group(0, LEADER)
    wait_ready(leader, network)
    generate(leader, network)
    # Both pods asked the shared cache for the same key: one built every rank's engine, the other reused it.
    assert len(read_records(records, "trtllm-build")) == 1, "the pods built the engine twice"
    # Rank 0 in the leader serves; the worker's rank was started by the leader's mpirun over ssh and loads only the
    # engine model, with every endpoint off.
    leader_servers = [p for p in processes(leader) if p.startswith("/opt/tritonserver/bin/tritonserver ")]
    worker_servers = [p for p in processes(worker) if p.startswith("/opt/tritonserver/bin/tritonserver ")]
    assert len(leader_servers) == 1 and "--load-model" not in leader_servers[0], processes(leader)
    assert len(worker_servers) == 1, processes(worker)
    rank1 = worker_servers[0]
    for flag in ("--allow-http=false", "--allow-grpc=false", "--allow-metrics=false", "--load-model=tensorrt_llm"):
        assert flag in rank1, rank1
    # sshd retitles itself "sshd: <its command line> [listener] ..."
    assert any(p.startswith("sshd: /usr/sbin/sshd -D") for p in processes(worker)), processes(worker)
    worker_stubs = [p for p in processes(worker) if "triton_python_backend_stub" in p]
    assert worker_stubs and all("/tensorrt_llm/" in p for p in worker_stubs), worker_stubs

    leader.kill(signal="SIGTERM")
    wait_exit(leader)  # mpirun ends every rank, then itself
    deadline = time.monotonic() + 60
    while any(p.startswith("/opt/tritonserver/bin/tritonserver ") for p in processes(worker)):
        assert time.monotonic() < deadline, processes(worker)
        time.sleep(1)


def test_a_worker_that_never_appears_fails_the_leader_naming_it(group):
    leader = group(0, LEADER, WORKER_TIMEOUT_SECS="5")
    assert wait_exit(leader, 240) == 1, logs(leader)[-4000:]
    assert f"error: 1 of 1 workers not ready after 5 s: {WORKER}:2222" in logs(leader)


def test_a_worker_killed_mid_serve_makes_the_leader_exit_non_zero(group, network):
    worker = group(1, WORKER)
    leader = group(0, LEADER)
    wait_ready(leader, network)
    generate(leader, network)
    worker.kill()
    code = wait_exit(leader, 120)
    assert code != 0, logs(leader)[-4000:]
