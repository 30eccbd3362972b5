"""Whether a process of another UID could listen where the OpenAI front listens (the tests of its bind: it holds its
port on every local address, so no other user's process can take a share of its connections)."""

from __future__ import annotations

import os
import socket

NOBODY = 65534


def bind_as(uid: int, family: socket.AddressFamily, host: str, port: int, *, reuse: bool) -> int:
    """0 if a process of `uid` could listen on host:port (with SO_REUSEPORT and SO_REUSEADDR when `reuse`), else
    the errno it got. Needs root (to take the other UID)."""
    pid = os.fork()
    if pid == 0:  # the other UID's process
        code = 0
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                if reuse:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, port))
                sock.listen()
        except OSError as exc:
            code = exc.errno or 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
