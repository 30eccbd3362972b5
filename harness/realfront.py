"""FRONTEND=openai on this host, without Docker: what `trtllm-entrypoint prepare` prints (tritonserver's command
line, the OpenAI front's and its plan), run by the entrypoint's own supervisor (supervise.run) with the real
tritonserver 2.51.0 (harness/realtriton.py) in place of the image's path:

    out = json.loads(image.run("prepare", FRONTEND="openai", …).stdout)
    with realfront.start(layout, out, key) as front:    # key: the TRITON_ADMIN_KEY given to prepare
        front.url                                        # http://127.0.0.1:<OPENAI_PORT>
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import realtriton

ENTRYPOINTS = Path(__file__).resolve().parents[1] / "entrypoints"
KEY_FOR_TEST = "TRTLLM_TEST_ADMIN_KEY"
# What `serve` does after its exec-less start: the supervisor, with the front's environment made by the entrypoint.
SUPERVISOR = f"""
import json, os, sys
from trtllm_entrypoint.launch import supervise
from trtllm_entrypoint.openai.plan import FrontPlan
plan = json.loads(sys.argv[1])
key = os.environ.pop({KEY_FOR_TEST!r})
front_plan = FrontPlan.from_json(json.dumps(plan["front_plan"]))
front_env = supervise.front_environ(os.environ, key, front_plan)
grace = front_plan.shutdown_timeout + supervise.KILL_MARGIN_S  # as exec_server: the children's drain, then SIGKILL
sys.exit(supervise.run(plan["server"], plan["front"], plan["workers"], dict(os.environ), front_env, grace_s=grace))
"""


class RunningFront(realtriton.RunningServer):
    """The supervisor's process: OPENAI_PORT (as http_port), ready at the front's /health/ready."""

    READY_ROUTE = "/health/ready"
    NAME = "the OpenAI front's supervisor"

    triton_http_port: int = 0

    @property
    def url(self) -> str:
        return self.http_url

    @property
    def triton_url(self) -> str:
        return f"http://127.0.0.1:{self.triton_http_port}"


@contextmanager
def start(
    layout: realtriton.Layout,
    prepared: dict[str, Any],
    key: str,
    *,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    ready_timeout_s: float = 180,
    wait: bool = True,
) -> Iterator[RunningFront]:
    """Run `prepared`'s plan (prepare's JSON output) until the block ends (then SIGTERM, as `docker stop`)."""
    server = realtriton.with_admin_key(prepared["argv"], key)
    server_argv, http_port, _ = realtriton.server_argv(layout, server)
    front = prepared["front"]
    port = int(front["plan"]["port"])
    plan = {"server": server_argv, "front": front["argv"], "workers": front["workers"], "front_plan": front["plan"]}
    environ = layout.environ(env)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ENTRYPOINTS), environ.get("PYTHONPATH", "")) if p)
    environ[KEY_FOR_TEST] = key
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="openai-front-log-"))
    log_path = log_dir / f"openai-front-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 (open for the process's lifetime; stop() closes it)
    process = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, json.dumps(plan)],
        env=environ,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    running = RunningFront(process, server_argv, port, 0, log_path, log)
    running.triton_http_port = http_port
    try:
        if wait:
            running.wait_ready(ready_timeout_s)
        yield running
    finally:
        running.stop(timeout_s=60)
