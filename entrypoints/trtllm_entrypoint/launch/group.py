"""One model replica across several pods (a LeaderWorkerSet group): who this pod is, where the others are, whether the
group can hold the ranks, waiting for the workers, and how mpirun reaches them (ssh with the group's key).

LeaderWorkerSet sets LWS_LEADER_ADDRESS (`<set>-<group>.<subdomain>.<namespace>`), LWS_GROUP_SIZE and
LWS_WORKER_INDEX (0 = the leader) in every pod. Worker i is the pod `<set>-<group>-<i>`, resolvable under the same
subdomain: the leader finds its workers by name, never by asking the API server.

Every pod prepares the same engine and repository (from the shared cache: built once under its lock; from a per-pod
cache: each builds its own, slower but as safe), so every rank finds the same paths. A worker then runs sshd on
MPI_SSH_PORT and waits; the leader waits until every worker's sshd answers, then execs mpirun, whose ranks > 0 it
starts over ssh. Nothing here runs a program: main does, with the argv built here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from trtllm_entrypoint import contract
from trtllm_entrypoint.config.environment import Env
from trtllm_entrypoint.errors import EntrypointError, UsageError

KEY_NAME = "id_ed25519"  # the Secret's keys: id_ed25519 and id_ed25519.pub
SSHD = "/usr/sbin/sshd"  # sshd refuses to start from a relative path
# Never sent to other ranks: this pod's identity, and secrets ranks > 0 do not need.
_IDENTITY = ("HOSTNAME", "HOME", "PWD", "OLDPWD", "SHLVL", "_", "TERM")
NOT_FORWARDED = frozenset((*_IDENTITY, "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "TRITON_ADMIN_KEY"))
NOT_FORWARDED_PREFIXES = ("LWS_", "OMPI_", "PMIX_", "SSH_")


@dataclass(frozen=True)
class Group:
    leader_address: str
    size: int
    index: int
    timeout_s: int = 3600  # WORKER_TIMEOUT_SECS: how long the leader waits for its workers (a first engine build)
    ssh_dir: Path = Path(contract.MPI_SSH_DIR)  # MPI_SSH_DIR: where the group's key Secret is mounted

    @property
    def is_leader(self) -> bool:
        return self.index == 0

    def host(self, index: int) -> str:
        """The DNS name of pod `index` of this group (0: the leader)."""
        if index == 0:
            return self.leader_address
        leader_pod, dot, domain = self.leader_address.partition(".")
        return f"{leader_pod}-{index}{dot}{domain}"

    @property
    def worker_hosts(self) -> tuple[str, ...]:
        return tuple(self.host(i) for i in range(1, self.size))


LWS_VARIABLES = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
# One DNS label (RFC 1123): it reaches `mpirun --host` and ssh, where '-' first reads as an option and ',' adds hosts.
DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_host_address(address: str) -> bool:
    """A DNS name or an IP address, and nothing else."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(address)
        return True
    return 0 < len(address) <= 253 and all(DNS_LABEL.fullmatch(label) for label in address.split("."))


def group_from_env(environ: Mapping[str, str]) -> Group | None:
    """The group this pod belongs to; None outside a LeaderWorkerSet (or in a group of one pod)."""
    env = Env(environ)
    given = {name: env.text(name) for name in LWS_VARIABLES}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise UsageError(
            f"{', '.join(missing)} not set, but {', '.join(n for n in LWS_VARIABLES if n not in missing)} is",
            "LeaderWorkerSet sets all three; set all of them or none",
        )
    size = cast(int, env.whole("LWS_GROUP_SIZE", 1))
    index = cast(int, env.whole("LWS_WORKER_INDEX", 0, size - 1))
    address = cast(str, given["LWS_LEADER_ADDRESS"])
    if not is_host_address(address):
        raise UsageError(
            f"LWS_LEADER_ADDRESS={address!r} is not a DNS name or an IP address: expected labels of letters, "
            "digits and '-', not starting or ending with '-', at most 253 characters in all (it reaches mpirun "
            "--host and ssh)",
            "LeaderWorkerSet sets it; do not override it",
        )
    timeout = env.integer("WORKER_TIMEOUT_SECS")
    ssh_dir = Path(env.text("MPI_SSH_DIR") or contract.MPI_SSH_DIR)
    return None if size == 1 else Group(address, size, index, timeout, ssh_dir)


def ranks_per_pod(world_size: int, group: Group, gpus_per_pod: int) -> tuple[int, ...]:
    """How many ranks each pod runs (one per GPU, filling pods in order); refused when the group cannot hold them
    or when a pod would hold none."""
    capacity = group.size * gpus_per_pod
    if world_size > capacity:
        raise UsageError(
            f"TP_SIZE x PP_SIZE = {world_size} ranks, but the group's {group.size} pods hold {group.size} x "
            f"{gpus_per_pod} = {capacity} GPUs",
            "lower TP_SIZE x PP_SIZE, or give the LeaderWorkerSet more pods (size) or each pod more GPUs",
        )
    if world_size <= (group.size - 1) * gpus_per_pod:
        raise UsageError(
            f"TP_SIZE x PP_SIZE = {world_size} ranks fit in {-(-world_size // gpus_per_pod)} of the group's "
            f"{group.size} pods ({gpus_per_pod} GPUs each): the others would hold no rank",
            "make the LeaderWorkerSet's size TP x PP / GPUs per pod",
        )
    return tuple(min(gpus_per_pod, world_size - i * gpus_per_pod) for i in range(group.size))


def require_frontend(frontend: str, group: Group) -> None:
    """Only FRONTEND=triton is proven with ranks on other pods (mpirun over ssh, tests/docker/test_multinode.py);
    the OpenAI front's supervised process tree is not. Refused before any download or build."""
    if frontend != "triton":
        raise UsageError(
            f"FRONTEND={frontend} cannot serve a multi-pod group (LWS_GROUP_SIZE={group.size}): the OpenAI front "
            "and its supervisor are served from one pod only",
            "use FRONTEND=triton in a multi-pod group (Triton's HTTP/gRPC API), or serve the OpenAI API from one "
            "pod (a LeaderWorkerSet of size 1, TP_SIZE x PP_SIZE within that pod's GPUs)",
        )


def require_ssh(group: Group, which: Callable[[str], str | None] = shutil.which) -> None:
    """The leader needs the ssh client, a worker sshd: refused before any work when the image lacks them."""
    program = "ssh" if group.is_leader else SSHD
    if which(program) is None:
        role = "the leader" if group.is_leader else f"worker {group.index}"
        raise UsageError(
            f"{role} of a multi-node group needs {program}, and this image has none",
            "multi-node groups start their ranks over ssh: run the group image (`python build.py --tag TAG "
            "--multinode` builds trtllm-serve-group), or another image with OpenSSH's client and server",
        )


def wait_for_workers(
    group: Group,
    *,
    port: int = contract.MPI_SSH_PORT,
    connect: Callable[[tuple[str, int], float], object] = socket.create_connection,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = lambda message: None,
) -> None:
    """Until every worker's sshd accepts a connection (it listens once the worker's engine is ready), or the timeout
    passes: then one error naming the workers still missing."""
    missing = list(group.worker_hosts)
    timeout_s = group.timeout_s
    deadline = clock() + timeout_s
    while True:
        for host in list(missing):
            try:
                conn = connect((host, port), 2.0)
            except OSError:
                continue
            close = getattr(conn, "close", None)
            if close is not None:
                close()
            missing.remove(host)
            log(f"worker {host} is ready")
        if not missing:
            return
        if clock() >= deadline:
            raise EntrypointError(
                f"{len(missing)} of {group.size - 1} workers not ready after {timeout_s:g} s: "
                + ", ".join(f"{host}:{port}" for host in missing),
                "check that these pods run and finished preparing (their logs); raise WORKER_TIMEOUT_SECS for a "
                "slow first engine build",
            )
        sleep(1.0)


@dataclass(frozen=True)
class SshFiles:
    """The group's key, copied where only this process reads it (ssh refuses a key others can read)."""

    directory: Path

    @property
    def key(self) -> Path:
        return self.directory / KEY_NAME

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.directory / "authorized_keys"

    @property
    def sshd_config(self) -> Path:
        return self.directory / "sshd_config"


def install_ssh_files(source: Path, directory: Path, port: int = contract.MPI_SSH_PORT) -> SshFiles:
    """Copy the Secret's key pair to `directory` (mode 0700, key 0600); the same pair is the workers' host key and
    the leader's login key, so the leader can verify every worker without per-pod host keys. Idempotent."""
    private, public = source / KEY_NAME, source / f"{KEY_NAME}.pub"
    for path in (private, public):
        if not path.is_file():
            raise UsageError(
                f"the group's ssh key {path} is missing",
                f"create the Secret named in the manifests with {KEY_NAME} and {KEY_NAME}.pub (docs/kserve.md)",
            )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = SshFiles(directory)
    shutil.copyfile(private, files.key)
    os.chmod(files.key, 0o600)
    public_key = public.read_text().strip()
    files.authorized_keys.write_text(public_key + "\n")
    files.known_hosts.write_text(f"[*]:{port} {public_key}\n* {public_key}\n")
    files.sshd_config.write_text(sshd_config(files, port))
    return files


def sshd_config(files: SshFiles, port: int) -> str:
    """An sshd that any UID can run: key login for this user only, no forwarding, no password, no PAM."""
    options = {
        "Port": str(port),
        "HostKey": str(files.key),
        "AuthorizedKeysFile": str(files.authorized_keys),
        "PidFile": str(files.directory / "sshd.pid"),
        "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no",
        "PubkeyAuthentication": "yes",
        "UsePAM": "no",
        "StrictModes": "no",  # the Secret volume's group bits (fsGroup) are not the user's doing
        "AllowTcpForwarding": "no",
        "X11Forwarding": "no",
        "PermitTunnel": "no",
        "PermitUserEnvironment": "no",
    }
    return "".join(f"{key} {value}\n" for key, value in options.items())


def sshd_argv(files: SshFiles) -> list[str]:
    """The worker's main process: sshd in the foreground, logging to stderr."""
    return [SSHD, "-D", "-e", "-f", str(files.sshd_config)]


def ssh_args(files: SshFiles, port: int = contract.MPI_SSH_PORT) -> str:
    """How mpirun's ssh reaches a worker: the group key, the workers verified by it, never a prompt."""
    options = [
        f"-p {port}",
        f"-i {files.key}",
        "-o BatchMode=yes",
        "-o StrictHostKeyChecking=yes",
        f"-o UserKnownHostsFile={files.known_hosts}",
        "-o ConnectTimeout=10",
        "-o ServerAliveInterval=10",  # a vanished worker ends the session, and with it the job
    ]
    return " ".join(options)


def forwarded_env(env: Mapping[str, str]) -> list[str]:
    """The variables mpirun copies to the ranks it starts over ssh (an ssh session has none of the image's)."""
    return sorted(
        name
        for name in env
        if name not in NOT_FORWARDED and not name.startswith(NOT_FORWARDED_PREFIXES) and name.isidentifier()
    )


def mpirun_options(group: Group, per_pod: Sequence[int], files: SshFiles) -> list[str]:
    """What mpirun needs once, on top of the one-pod command: the pods and their slots, ssh as the launcher."""
    hosts = ",".join(f"{group.host(i)}:{slots}" for i, slots in enumerate(per_pod))
    options = ["--host", hosts, "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", ssh_args(files)]
    # Open MPI shortens host names to their first label, which only the pod itself knows; keep the LWS names.
    options += ["--mca", "orte_keep_fqdn_hostnames", "1"]
    return options


def rank_options(env: Mapping[str, str]) -> list[str]:
    """What every rank's context needs: the environment. Open MPI applies `-x` to the app context it is given in
    only, so given once before rank 0, ranks > 0 would start over ssh without LD_LIBRARY_PATH and the rest."""
    return [option for name in forwarded_env(env) for option in ("-x", name)]
