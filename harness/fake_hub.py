"""A Hugging Face hub on 127.0.0.1 (point HF_ENDPOINT at `url`): one repository's files and its model API, every
request recorded. `seconds_per_file` spreads each file's body over that time, so a download lasts long enough to be
watched."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from collections.abc import Callable

# (status, headers, body) for a request path, or None to answer as the hub does: a hostile or broken hub.
Override = Callable[[str], "tuple[int, dict[str, str], bytes] | None"]


class FakeHub:
    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        seconds_per_file: float = 0.0,
        override: Override | None = None,
    ):
        self.requests: list[str] = []
        self.headers: list[dict[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _model_info(self) -> bool:
                """The model API (with sizes when asked for blobs) and the file tree newer clients list."""
                api = f"/api/models/{repo_id}"
                path = self.path.split("?")[0]
                if path.startswith(api + "/tree/"):
                    tree = [
                        {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                        for name, data in files.items()
                    ]
                    body = json.dumps(tree)
                elif path == api or path.startswith(api + "/revision/"):
                    with_sizes = "blobs=" in self.path
                    siblings = [
                        {"rfilename": name, **({"size": len(data)} if with_sizes else {})}
                        for name, data in files.items()
                    ]
                    body = json.dumps({"id": repo_id, "modelId": repo_id, "sha": FakeHub.COMMIT, "siblings": siblings})
                else:
                    return False
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())
                return True

            def _answer(self, body: bool) -> None:
                hub.requests.append(f"{self.command} {self.path}")
                hub.headers.append(dict(self.headers.items()))
                answer = override(self.path) if override is not None else None
                if answer is not None:
                    status, headers, data = answer
                    self.send_response(status)
                    for name, value in {"Content-Length": str(len(data)), **headers}.items():
                        self.send_header(name, value)
                    self.end_headers()
                    if body:
                        self.wfile.write(data)
                    return
                if self._model_info():
                    return
                prefix = f"/{repo_id}/resolve/"
                name = (
                    self.path.split("?")[0][len(prefix) :].split("/", 1)[-1] if self.path.startswith(prefix) else None
                )
                if name not in files:
                    self.send_error(404)
                    return
                data = files[name]
                self.send_response(200)
                self.send_header("X-Repo-Commit", FakeHub.COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()[:16]}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not body:
                    return
                chunks = max(1, min(len(data), 20))
                step = -(-len(data) // chunks)
                for start in range(0, len(data), step):
                    self.wfile.write(data[start : start + step])
                    self.wfile.flush()
                    time.sleep(seconds_per_file / chunks)

            def do_HEAD(self):  # noqa: N802 (http.server's naming)
                self._answer(body=False)

            def do_GET(self):  # noqa: N802
                self._answer(body=True)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
