"""Run the real entrypoint outside an image: a directory laid out like our server image, with the NVIDIA programs
replaced by the doubles of tests/doubles (the same set-up as harness/image.py), and checkpoints of any size.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.build_standin import upstream_templates
from harness.doubles import double_environ, install_doubles, read_records, without_caller_variables
from harness.image_data import write_image_data
from harness.realtriton import free_port, with_admin_key
from harness.tiny_checkpoint import tiny_llama
from trtllm_images import matrix

REPO = Path(__file__).resolve().parents[1]
SERVE_SHIM = Path(__file__).resolve().parent / "serve_shim.py"
BENCH_ADMIN_KEY = "benchmark-admin-key-0123456789"  # restricted APIs stay closed, as in a default start


def sized_checkpoint(dest: Path, total_bytes: int, shards: int, tokenizer: str = "wordlevel") -> Path:
    """A Llama checkpoint whose weights are `shards` safetensors files adding up to `total_bytes`.

    The shards are sparse (one tensor header, then os.truncate), so a 20 GB model costs no disk and no write time;
    the entrypoint only stats weights, it never reads them.
    """
    tiny_llama(dest, tokenizer)
    (dest / "model.safetensors").unlink()
    per_shard = total_bytes // shards
    weight_map = {}
    for index in range(1, shards + 1):
        name = f"model-{index:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{index - 1}.weight"
        header = json.dumps(
            {tensor: {"dtype": "F16", "shape": [per_shard // 2], "data_offsets": [0, per_shard // 2 * 2]}},
            separators=(",", ":"),
        ).encode()
        header += b" " * (-len(header) % 8)
        path = dest / name
        path.write_bytes(struct.pack("<Q", len(header)) + header)
        os.truncate(path, 8 + len(header) + per_shard // 2 * 2)
        weight_map[tensor] = name
    (dest / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": per_shard // 2 * 2 * shards}, "weight_map": weight_map})
    )
    return dest


def checkpoint_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def json_events(stderr: str) -> list[dict]:
    """The entrypoint's LOG_FORMAT=json events; the doubles' own (non-JSON) lines are skipped."""
    events = []
    for line in stderr.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "msg" in event:
            events.append(event)
    return events


@dataclass
class Start:
    """One `trtllm-entrypoint serve` run until it exec'd the tritonserver double (which is then stopped)."""

    started: float  # time.time() just before the process was launched
    server_time: float  # the double's record "time": after the exec and the double's interpreter start
    events: list[dict]
    returncode: int

    @property
    def seconds(self) -> float:
        return self.server_time - self.started


class Sandbox:
    """A directory that looks to the entrypoint like the inside of our server image for `tag`."""

    def __init__(self, root: Path, tag: str = "25.01"):
        entry = matrix.load().get(tag)
        self.root = root
        paths = install_doubles(
            root / "doubles",
            trtllm_version=entry.tensorrt_llm,
            tensorrt_version=entry.tensorrt or "0",
            with_app=True,
            templates_src=upstream_templates(entry.tensorrt_llm),
        )
        matrix_file = write_image_data(root)
        env = without_caller_variables(double_environ(paths, root / "records"))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "entrypoints"), env["PYTHONPATH"]])
        # In the image our code is byte-compiled when pip installs the wheel; here it would be compiled again at
        # every start if the machine forbids bytecode files (PYTHONDONTWRITEBYTECODE), so keep them in the sandbox.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        env.update(
            MATRIX_TAG=tag,
            TRTLLM_MATRIX_FILE=str(matrix_file),
            TRTLLM_APP_DIR=str(paths["app"]),
            LOG_FORMAT="json",
            BENCH_TRITONSERVER=str(paths["bin"] / "tritonserver"),
        )
        self.base_env = env

    def env(self, model: Path, cache: Path, records: Path, **overrides: str) -> dict[str, str]:
        return {
            **self.base_env,
            "MODEL_ID": str(model),
            "CACHE_DIR": str(cache),
            "DOUBLE_RECORD_DIR": str(records),
            **overrides,
        }

    @staticmethod
    def launch(*args: str, env: dict[str, str], stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(SERVE_SHIM), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )

    def prepare(self, env: dict[str, str]) -> dict:
        """`prepare` to completion (fills the cache); the launch command it prints (argv, repository, …), with the
        admin key put back that `prepare` leaves out, so the argv runs as `serve` would run it."""
        env = {"TRITON_ADMIN_KEY": BENCH_ADMIN_KEY, **env}
        proc = self.launch("prepare", env=env)
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"prepare exited {proc.returncode}:\n{err[-2000:]}")
        launch = json.loads(out)
        launch["argv"] = with_admin_key(launch["argv"], env["TRITON_ADMIN_KEY"])
        return launch

    def serve_many(self, envs: list[dict[str, str]], timeout_s: float = 300) -> list[Start]:
        """Launch one `serve` per environment (back to back), wait until each exec'd the server, stop them all.

        Each gets its own HTTP port (the server double binds it) and its own stderr file (a pipe nobody reads
        while we wait could fill up and stall the process being measured).
        """
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        launches: list[tuple[float, subprocess.Popen, Path]] = []
        try:
            for env in envs:
                env = {**env, "HTTP_PORT": str(free_port())}
                fd, name = tempfile.mkstemp(dir=logs, suffix=".stderr")
                log_path = Path(name)
                with os.fdopen(fd, "w") as err:
                    started = time.time()
                    launches.append(
                        (started, self.launch("serve", env=env, stdout=subprocess.DEVNULL, stderr=err), log_path)
                    )
            times = _wait_for_servers(launches, {env["DOUBLE_RECORD_DIR"] for env in envs}, timeout_s)
        finally:
            for _, proc, _ in launches:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
        return [
            Start(
                started=started,
                server_time=times[proc.pid],
                events=json_events(log_path.read_text()),
                returncode=proc.returncode,
            )
            for started, proc, log_path in launches
        ]

    def serve(self, env: dict[str, str]) -> Start:
        return self.serve_many([env])[0]


def _wait_for_servers(
    launches: list[tuple[float, subprocess.Popen, Path]], records_dirs: set[str], timeout_s: float
) -> dict[int, float]:
    """{pid: time of its tritonserver record} once every launch has one.

    A served process keeps its pid across the exec, so records are matched to launches by pid; a record older than
    its launch is an earlier run's (pids get reused).
    """
    started_at = {proc.pid: started for started, proc, _ in launches}
    deadline = time.monotonic() + timeout_s
    times: dict[int, float] = {}
    while len(times) < len(launches):
        for directory in records_dirs:
            times.update(
                {
                    r["pid"]: r["time"]
                    for r in read_records(Path(directory), "tritonserver")
                    if r["time"] >= started_at.get(r["pid"], float("inf"))
                }
            )
        for _, proc, log_path in launches:
            if proc.poll() is not None and proc.pid not in times:
                raise RuntimeError(
                    f"serve exited {proc.returncode} before starting the server:\n{log_path.read_text()[-2000:]}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(times)} of {len(launches)} servers started in {timeout_s:g} s")
        time.sleep(0.005)
    return times
