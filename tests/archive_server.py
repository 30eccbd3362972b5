"""GitHub stand-in for download tests: a real HTTP server on 127.0.0.1 that serves tarballs made on the fly, in full,
or cut off mid-body (the connection closes before Content-Length bytes arrived)."""

from __future__ import annotations

import hashlib
import io
import socket
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tarball(
    top: str,
    files: dict[str, bytes],
    symlinks: dict[str, str] | None = None,
    *,
    compression: str = "gz",
    commit: str | None = None,
    members: list[tarfile.TarInfo] | None = None,
) -> bytes:
    """A source archive like GitHub's: every member under `top`/ (except names given as absolute or starting with
    '..'), files ending in .sh executable, then `members` as they are; `commit` goes into git's pax header.
    `compression`: gz, bz2, xz or "" (plain tar)."""
    buffer = io.BytesIO()
    headers = {"comment": commit} if commit else {}
    with tarfile.open(fileobj=buffer, mode=f"w:{compression}", format=tarfile.PAX_FORMAT, pax_headers=headers) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name if name.startswith(("/", "..")) else f"{top}/{name}")
            info.size, info.mode = len(data), 0o775 if name.endswith(".sh") else 0o664
            tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for info in members or []:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buffer.getvalue()


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    """A symlink (or, with kind=LNKTYPE, a hard link) member named exactly `name`."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def regular(name: str, size: int = 1) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArchiveServer:
    """`served[path] = bytes` answers in full; `cut[path] = n` sends only the first n bytes, then hangs up;
    a path in `unsized` is sent without Content-Length (the client cannot tell a cut-off body by its length)."""

    def __init__(self):
        self.served: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.unsized: set[str] = set()
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                body = server.served.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-gzip")
                if self.path not in server.unsized:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: server.cut.get(self.path, len(body))])
                self.close_connection = True

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}{path}"

    def __enter__(self) -> ArchiveServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def refused_url(path: str = "/archive.tar.gz") -> str:
    """A URL on 127.0.0.1 where nothing listens: connecting is refused, as on a machine without network."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
