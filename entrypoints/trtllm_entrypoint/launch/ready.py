"""The line that says the server is ready, and the short-lived watcher that prints it.

`summary` is pure: what is served (model and source, tag, TensorRT-LLM, workflow), where (ports, served model name),
how the admin APIs are guarded (never the key) and one request to try, all from the plan. `spawn_watcher` forks,
just before the server is exec'd, a watcher that polls the readiness endpoint, logs the line once and exits; the
server keeps this process's PID and so gets the container's signals. The watcher is double-forked: its orphan is
reaped by PID 1 (the images run tini there), and none is started when this process is PID 1 itself, where nothing
would reap it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trtllm_entrypoint.repository import fill

if TYPE_CHECKING:
    from trtllm_entrypoint.config.settings import Settings
    from trtllm_entrypoint.launch.plan import LaunchPlan
    from trtllm_entrypoint.log import Log
    from trtllm_entrypoint.openai.plan import FrontPlan

PROMPT = "What is TensorRT-LLM?"
MAX_TOKENS = 64
POLL_S = 1.0


def served_names(launch: LaunchPlan) -> list[str]:
    """The names clients use: the OpenAI front's, the entry model of a repository we fill, or every model of one
    given as is."""
    if launch.front is not None:
        return [launch.front.served_name]
    if launch.plan.fills_repository:
        return [fill.served_name(launch.settings, launch.plan.workflow)]
    return sorted(path.parent.name for path in launch.repository.glob("*/config.pbtxt"))


def try_command(settings: Settings, workflow: str, name: str, front: FrontPlan | None = None) -> str:
    """One request to copy and paste: OpenAI chat when the plan has the OpenAI front, else Triton's generate."""
    if front is not None:
        url = f"http://localhost:{front.port}/v1/chat/completions"
        body: dict[str, object] = {
            "model": name,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
        }
        return shlex.join(["curl", "-s", url, "-H", "Content-Type: application/json", "-d", json.dumps(body)])
    url = f"http://localhost:{settings.http_port}/v2/models/{name}/generate"
    if workflow == "llmapi":
        body = {"text_input": PROMPT, "sampling_param_max_tokens": MAX_TOKENS}
    else:  # the ensemble; older releases need the word lists, empty
        body = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "bad_words": "", "stop_words": ""}
    return shlex.join(["curl", "-s", url, "-d", json.dumps(body)])


def _admin_key(settings: Settings) -> str:
    if not settings.restricted_apis:
        return "unused (RESTRICTED_APIS=none)"
    return "random (nobody can call the restricted APIs)" if settings.admin_key_generated else "given"


def summary(launch: LaunchPlan) -> dict[str, object]:
    """The ready line's fields, in reading order; `try` last, so that in text logs the rest of the line is it."""
    settings, model = launch.settings, launch.plan.model
    names = served_names(launch)
    # What answers inside the container; a port is reached from outside only where it is published (-p, a Service).
    endpoints: dict[str, object] = {"ports": "inside the container (publish the ones you use: docker run -p PORT:PORT)"}
    front = launch.front
    if front is not None:
        endpoints["openai"] = f"http://localhost:{front.port}/v1"
    endpoints["http"] = f"http://localhost:{settings.http_port}"
    endpoints["grpc"] = f"localhost:{settings.grpc_port}"
    endpoints["metrics"] = f"http://localhost:{settings.metrics_port}/metrics"
    return {
        "model": model.repo_id or str(model.path),
        "source": model.kind if model.repo_id is None else f"hub@{model.revision}",
        "tag": launch.facts.tag,
        "tensorrt_llm": launch.facts.tensorrt_llm,
        "workflow": launch.plan.workflow,
        "frontend": settings.frontend,
        **endpoints,
        "served_model_name": ",".join(names),
        "admin_key": _admin_key(settings),
        "try": try_command(settings, launch.plan.workflow, names[0] if names else "<model>", front),
    }


def is_ready(url: str) -> bool:
    import urllib.error  # noqa: PLC0415  (only the watcher needs HTTP: a warm start does not pay for the import)
    import urllib.request  # noqa: PLC0415

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    """Whether `pid` still runs: an exited server that its parent has not reaped yet (a zombie) counts as gone, or the
    watcher would keep the log pipe open while that parent waits for it to close before reaping."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no procfs: ask the kernel, which cannot tell a zombie
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def watch(url: str, server_pid: int, log: Log, fields: Mapping[str, object], poll_s: float = POLL_S) -> bool:
    """Poll `url` while the server lives; log the ready line once it answers. Whether it did."""
    while _alive(server_pid):
        if is_ready(url):
            log.info("ready", **fields)
            return True
        time.sleep(poll_s)
    return False


def _keep_only_stderr() -> None:
    """The watcher shares only the log (stderr) with the server: stdout may be a pipe whose reader waits for it to
    close, and an inherited lock (REPOSITORY_DIR's) must be released when the server exits, not when we do."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    try:
        inherited = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        inherited = list(range(3, 256))
    for fd in inherited:
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)


def spawn_watcher(url: str, log: Log, fields: Mapping[str, object]) -> int | None:
    """Fork the watcher of the process about to exec the server; the pid of the intermediate child (already
    reaped), or None when no watcher is started (PID 1: its orphan would never be reaped)."""
    if os.getpid() == 1:
        log.warn(
            "no ready line: the entrypoint is PID 1, so nothing would reap its watcher; run the image's "
            "ENTRYPOINT (tini) or docker run --init"
        )
        return None
    server_pid = os.getpid()
    sys.stdout.flush()  # what is buffered now would otherwise be written twice, once by each process
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # intermediate: fork the watcher and exit at once, so that the watcher is an orphan
        try:
            if os.fork() == 0:
                _keep_only_stderr()
                code = 0
                try:
                    watch(url, server_pid, log, fields)
                except BaseException:  # noqa: BLE001  (a watcher must never print a traceback into the server's log)
                    code = 1
                os._exit(code)
        finally:
            os._exit(0)
    os.waitpid(child, 0)  # reaped before the exec: the server never sees a child it did not start
    return child
