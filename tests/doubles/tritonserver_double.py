#!/usr/bin/env python3
"""Stand-in for /opt/tritonserver/bin/tritonserver: checks the model repositories like Triton would, then answers
the KServe v2 health endpoints until SIGTERM/SIGINT (exit 0).

Env: DOUBLE_RECORD_DIR (records), TRITONSERVER_DOUBLE_READY_DELAY (seconds before /v2/health/ready turns 200).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from double_records import last, parse_flags, record  # noqa: E402
from help_flags import program_flags, usage  # noqa: E402

# A quoted protobuf string, so that `${...}` inside one (the backend's "unset" marker) is not taken for syntax.
QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"')
USAGE = "Usage: tritonserver [options]  (test double: --model-repository/--model-store, --http-port, --allow-http)"


def unparsable_placeholder(text: str) -> int | None:
    """Line number of a `${` that Triton's protobuf text parser would choke on (outside strings and comments).

    The backend's templates keep `"${name}"` string values on purpose (the backend reads them as unset), and Triton
    loads those; an unfilled `max_batch_size: ${triton_max_batch_size}` is a parse error.
    """
    for number, line in enumerate(text.splitlines(), 1):
        if "${" in QUOTED.sub('""', line).split("#", 1)[0]:
            return number
    return None


def check_repositories(repositories: list[str]) -> tuple[list[str], str | None]:
    """(model names, error message or None), failing where real Triton fails to load a repository."""
    if not repositories:
        return [], "error: --model-repository must be specified"
    models: list[str] = []
    for repo in repositories:
        root = Path(repo)
        if not root.is_dir():
            return [], f"error: failed to stat model repository path '{repo}': No such file or directory"
        configs = sorted(root.glob("*/config.pbtxt"))
        if not configs:
            return [], f"error: model repository '{repo}' holds no model (no */config.pbtxt)"
        for config in configs:
            line = unparsable_placeholder(config.read_text(errors="replace"))
            if line is not None:
                return [], f"error: failed to parse {config}:{line}: unfilled template placeholder '${{'"
        models.extend(c.parent.name for c in configs)
    return models, None


def make_handler(models: list[str], ready_at: float):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            ready = time.monotonic() >= ready_at
            paths = {"/v2/health/live": True, "/v2/health/ready": ready}
            paths.update({f"/v2/models/{m}/ready": ready for m in models})
            if self.path not in paths:
                status = 404
            else:
                status = 200 if paths[self.path] else 400
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:  # health polls would flood the container log
            pass

    return Handler


def full_names(argv: list[str]) -> list[str]:
    """Unique prefixes written out, as the real server's getopt_long reads them (--model-repo=/x serves /x)."""
    known = program_flags("tritonserver", ())
    out = []
    for arg in argv:
        name, sep, value = arg.partition("=")
        matches = [flag for flag in known if flag.startswith(name)] if arg.startswith("--") else []
        if name not in known and len(matches) == 1:
            arg = matches[0] + sep + value
        out.append(arg)
    return out


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        record("tritonserver", argv)
        print(USAGE + "\n\n" + usage("tritonserver", program_flags("tritonserver", ())))
        return 1  # as the real one does
    flags = parse_flags(full_names(argv))
    repositories = flags.get("model-repository", []) + flags.get("model-store", [])
    models, error = check_repositories(repositories)
    record("tritonserver", argv, models=sorted(models))
    if error:
        print(error, file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = None
    if last(flags, "allow-http", "true").lower() not in ("false", "0"):
        port = int(last(flags, "http-port", "8000"))
        delay = float(os.environ.get("TRITONSERVER_DOUBLE_READY_DELAY") or 0)
        server = ThreadingHTTPServer(("0.0.0.0", port), make_handler(models, time.monotonic() + delay))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(f"I0000 tritonserver double: Started HTTPService at 0.0.0.0:{port}", file=sys.stderr, flush=True)
    print(f"I0000 tritonserver double: serving models {', '.join(sorted(models))}", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    if server is not None:
        server.shutdown()
    print("I0000 tritonserver double: exiting on signal", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
