"""Multi-node groups (LeaderWorkerSet): roles, LWS host names, what the group can hold, waiting for workers, and the
mpirun command that spans the pods. The entrypoint's own runs (`prepare`, `serve`) are at the end."""

from __future__ import annotations

import json
import stat

import pytest

from harness.doubles import read_records
from harness.image import Image, templates_for
from tests.unit.test_launch import make_settings
from trtllm_entrypoint import contract
from trtllm_entrypoint.errors import EntrypointError, UsageError
from trtllm_entrypoint.launch import argv as launch
from trtllm_entrypoint.launch import group

LWS = {"LWS_LEADER_ADDRESS": "llm-0.llm.default", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
ONE_GPU = "NVIDIA H100 80GB HBM3|9.0|81559"


def test_no_lws_variables_is_no_group_and_a_group_of_one_is_none():
    assert group.group_from_env({}) is None
    assert group.group_from_env({**LWS, "LWS_GROUP_SIZE": "1"}) is None


def test_leader_and_workers_are_named_as_lws_names_its_pods():
    leader = group.group_from_env(LWS)
    assert leader is not None and leader.is_leader and leader.size == 2
    assert leader.host(0) == "llm-0.llm.default"
    worker = group.group_from_env(
        {**LWS, "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": "3", "LWS_LEADER_ADDRESS": "chat-5.chat.team"}
    )
    assert worker is not None and not worker.is_leader
    assert worker.worker_hosts == ("chat-5-1.chat.team", "chat-5-2.chat.team", "chat-5-3.chat.team")
    assert worker.timeout_s == 3600 and str(worker.ssh_dir) == contract.MPI_SSH_DIR


@pytest.mark.parametrize(
    "env, message",
    [
        ({"LWS_GROUP_SIZE": "2"}, "LWS_LEADER_ADDRESS, LWS_WORKER_INDEX not set, but LWS_GROUP_SIZE is"),
        (
            {**LWS, "LWS_WORKER_INDEX": "two"},
            "LWS_WORKER_INDEX='two' is not allowed: expected a whole number from 0 to 1",
        ),
        ({**LWS, "LWS_WORKER_INDEX": "2"}, "LWS_WORKER_INDEX='2' is not allowed: expected a whole number from 0 to 1"),
        ({**LWS, "LWS_GROUP_SIZE": "0"}, "LWS_GROUP_SIZE='0' is not allowed: expected a whole number of at least 1"),
        ({**LWS, "LWS_GROUP_SIZE": "²"}, "LWS_GROUP_SIZE='²' is not allowed"),
        ({**LWS, "LWS_LEADER_ADDRESS": "llm-0..default"}, "is not a DNS name"),
        (
            {**LWS, "WORKER_TIMEOUT_SECS": "0"},
            "WORKER_TIMEOUT_SECS='0' is not allowed: expected a whole number from 1 to",
        ),
    ],
)
def test_bad_lws_variables_are_usage_errors(env, message):
    with pytest.raises(UsageError) as info:
        group.group_from_env(env)
    assert message in info.value.message


def test_ranks_fill_the_pods_gpus_in_order():
    two = group.Group("llm-0.llm.default", 2, 0)
    assert group.ranks_per_pod(16, two, 8) == (8, 8)
    assert group.ranks_per_pod(12, two, 8) == (8, 4)
    assert group.ranks_per_pod(2, two, 1) == (1, 1)


def test_a_group_that_cannot_hold_the_ranks_or_leaves_a_pod_idle_is_refused():
    two = group.Group("llm-0.llm.default", 2, 0)
    with pytest.raises(UsageError) as info:
        group.ranks_per_pod(32, two, 8)
    assert "TP_SIZE x PP_SIZE = 32 ranks, but the group's 2 pods hold 2 x 8 = 16 GPUs" in info.value.message
    with pytest.raises(UsageError, match="the others would hold no rank"):
        group.ranks_per_pod(8, two, 8)
    with pytest.raises(UsageError, match="hold 2 x 0 = 0 GPUs"):
        group.ranks_per_pod(2, two, 0)


class FakeNetwork:
    """Workers that answer from a given time on; a clock that advances with every sleep."""

    def __init__(self, ready_at: dict[str, float]):
        self.ready_at, self.now, self.tries = ready_at, 0.0, []

    def connect(self, address, timeout):
        self.tries.append(address)
        host, _ = address
        if self.now < self.ready_at.get(host, float("inf")):
            raise ConnectionRefusedError(host)
        return None

    def sleep(self, seconds):
        self.now += seconds


def test_the_leader_waits_until_every_worker_answers():
    three = group.Group("llm-0.llm.default", 3, 0, timeout_s=60)
    net = FakeNetwork({"llm-0-1.llm.default": 5, "llm-0-2.llm.default": 12})
    said = []
    group.wait_for_workers(three, connect=net.connect, clock=lambda: net.now, sleep=net.sleep, log=said.append)
    assert 12 <= net.now < 14
    assert said == ["worker llm-0-1.llm.default is ready", "worker llm-0-2.llm.default is ready"]
    assert {port for _, port in net.tries} == {contract.MPI_SSH_PORT}


def test_a_worker_that_never_appears_fails_the_leader_naming_it():
    three = group.Group("llm-0.llm.default", 3, 0, timeout_s=30)
    net = FakeNetwork({"llm-0-1.llm.default": 0})
    with pytest.raises(EntrypointError) as info:
        group.wait_for_workers(three, connect=net.connect, clock=lambda: net.now, sleep=net.sleep)
    assert info.value.message == "1 of 2 workers not ready after 30 s: llm-0-2.llm.default:2222"
    assert "WORKER_TIMEOUT_SECS" in info.value.hint
    assert 30 <= net.now <= 31


def test_a_group_pod_without_ssh_is_refused_naming_the_program():
    worker = group.Group("llm-0.llm.default", 2, 1)
    with pytest.raises(UsageError) as info:
        group.require_ssh(worker, which=lambda name: None)
    assert info.value.message == "worker 1 of a multi-node group needs /usr/sbin/sshd, and this image has none"
    group.require_ssh(group.Group("llm-0.llm.default", 2, 0), which=lambda name: "/usr/bin/" + name)


def key_pair(directory):
    directory.mkdir()
    (directory / "id_ed25519").write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    (directory / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3fake group@llm\n")
    return directory


def test_ssh_files_are_private_and_verify_workers_by_the_group_key(tmp_path):
    files = group.install_ssh_files(key_pair(tmp_path / "secret"), tmp_path / "ssh")
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o700
    assert files.authorized_keys.read_text() == "ssh-ed25519 AAAAC3fake group@llm\n"
    assert files.known_hosts.read_text().splitlines() == [
        "[*]:2222 ssh-ed25519 AAAAC3fake group@llm",
        "* ssh-ed25519 AAAAC3fake group@llm",
    ]
    config = dict(line.split(" ", 1) for line in files.sshd_config.read_text().splitlines())
    assert config["Port"] == "2222" and config["HostKey"] == str(files.key)
    assert config["PasswordAuthentication"] == "no" and config["AllowTcpForwarding"] == "no"
    assert group.sshd_argv(files) == ["/usr/sbin/sshd", "-D", "-e", "-f", str(files.sshd_config)]
    # Idempotent: a restarted container installs the same files again.
    assert group.install_ssh_files(tmp_path / "secret", tmp_path / "ssh") == files


def test_a_missing_key_is_a_usage_error(tmp_path):
    (tmp_path / "secret").mkdir()
    with pytest.raises(UsageError, match="the group's ssh key .*id_ed25519 is missing"):
        group.install_ssh_files(tmp_path / "secret", tmp_path / "ssh")


def test_mpirun_spans_the_pods_over_ssh_and_forwards_the_environment_but_no_secret(tmp_path):
    two = group.Group("llm-0.llm.default", 2, 0)
    files = group.SshFiles(tmp_path / "ssh")
    env = {
        "PATH": "/usr/bin",
        "LD_LIBRARY_PATH": "/opt/x",
        "CACHE_DIR": "/var/cache/trtllm",
        "HF_TOKEN": "hf_secret",
        "TRITON_ADMIN_KEY": "k",
        "HOSTNAME": "llm-0",
        "LWS_WORKER_INDEX": "0",
        "OMPI_MCA_btl": "tcp,self",
        "BASH_FUNC_x%%": "() { :; }",
    }
    options = group.mpirun_options(two, (1, 1), files)
    assert options[:2] == ["--host", "llm-0.llm.default:1,llm-0-1.llm.default:1"]
    assert options[2:6] == ["--mca", "plm_rsh_agent", "ssh", "--mca"]
    assert options[6] == "plm_rsh_args"
    assert f"-i {files.key}" in options[7] and "-p 2222" in options[7] and "StrictHostKeyChecking=yes" in options[7]
    assert options[8:] == ["--mca", "orte_keep_fqdn_hostnames", "1"]
    per_rank = group.rank_options(env)
    assert per_rank == ["-x", "CACHE_DIR", "-x", "LD_LIBRARY_PATH", "-x", "PATH"]
    assert "hf_secret" not in " ".join(options + per_rank)


def test_the_leaders_mpirun_gives_every_rank_its_environment(tmp_path):
    """Open MPI applies -x to its own app context only: each rank's context carries the forwarded variables."""
    argv = launch.tritonserver_argv(
        make_settings(), tmp_path, 3, 1000, mpi_options=["--host", "a:1,b:2"], rank_options=["-x", "PATH"]
    )
    assert argv[:3] == ["mpirun", "--host", "a:1,b:2"]
    contexts = " ".join(argv[3:]).split(" : ")
    assert len(contexts) == 3
    assert all(c.startswith("-n 1 -x PATH /opt/tritonserver/bin/tritonserver ") for c in contexts)
    assert "--http-port=" in contexts[0]
    assert all("--allow-http=false" in c and "--load-model=tensorrt_llm" in c for c in contexts[1:])


# --- the entrypoint itself ---------------------------------------------------------------------------------------


@pytest.fixture
def image(tmp_path):
    return Image(tmp_path, "25.01", templates_for("v0.17.0"))


@pytest.mark.process
def test_serve_refuses_a_group_that_cannot_hold_tp_x_pp_before_any_work(image):
    result = image.run("serve", **LWS, TP_SIZE="4", NVIDIA_SMI_DOUBLE_GPUS=ONE_GPU)
    assert result.returncode == 2, result.stderr
    assert "TP_SIZE x PP_SIZE = 4 ranks, but the group's 2 pods hold 2 x 1 = 2 GPUs" in result.stderr
    assert read_records(image.records, "trtllm-build") == [] and read_records(image.records, "convert_checkpoint") == []


@pytest.mark.process
def test_the_leader_prepares_an_mpirun_across_the_group(image, tmp_path):
    result = image.run("prepare", **LWS, TP_SIZE="2", NVIDIA_SMI_DOUBLE_GPUS=ONE_GPU)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    assert argv[0] == "mpirun" and argv[argv.index("--host") + 1] == "llm-0.llm.default:1,llm-0-1.llm.default:1"
    assert argv[argv.index("plm_rsh_agent") + 1] == "ssh"
    rank0, rank1 = " ".join(argv).split(" : ")
    assert "--load-model=tensorrt_llm" in rank1 and "--allow-metrics=false" in rank1
    assert "--load-model" not in rank0


@pytest.mark.process
def test_the_leader_fails_naming_a_worker_that_never_appears(image, tmp_path):
    secret = key_pair(tmp_path / "secret")
    result = image.run(
        "serve", **LWS, TP_SIZE="2", NVIDIA_SMI_DOUBLE_GPUS=ONE_GPU, WORKER_TIMEOUT_SECS="2", MPI_SSH_DIR=str(secret)
    )
    assert result.returncode == 1, result.stderr
    assert "error: 1 of 1 workers not ready after 2 s: llm-0-1.llm.default:2222" in result.stderr
    assert len(read_records(image.records, "trtllm-build")) == 1, "the leader prepared its engine while waiting"
    assert read_records(image.records, "mpirun") == []
