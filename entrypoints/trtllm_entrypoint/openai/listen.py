"""The socket each worker of the front serves OPENAI_PORT on. Standard library only.

The wildcard address is bound dual-stack: one IPv6 socket on `::` with IPV6_V6ONLY off takes IPv4 too (as
v4-mapped addresses). Bound on 0.0.0.0 alone, the port's IPv6 side would stay free, and a process of another UID in
the same network namespace (a sidecar) could listen on `[::1]:OPENAI_PORT` and read what clients that reach
`localhost` over IPv6 send (Docker's `localhost` tries `::1` first), admin key included. With the dual-stack
wildcard bound, Linux refuses every other bind of the port on any local address, IPv4 or IPv6: SO_REUSEPORT joins
only sockets of the same effective UID (the workers), and SO_REUSEADDR never binds beside a listening wildcard.
Where the kernel has no IPv6 (no AF_INET6, or `::` cannot be bound), no process can listen on `::1` either, and the
IPv4 wildcard is enough.
"""

from __future__ import annotations

import errno
import socket

WILDCARDS = ("", "0.0.0.0", "::")
BACKLOG = 1024
# The kernel has no IPv6: the socket cannot be made, or `::` cannot be bound.
NO_IPV6 = {errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL}


def _bound(family: socket.AddressFamily, address: tuple[str, int], dual_stack: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the workers share the port
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening, non-blocking socket on `host`:`port`; the wildcard (``, `0.0.0.0`, `::`) dual-stack where the
    kernel has IPv6."""
    if host in WILDCARDS:
        if socket.has_ipv6:
            try:
                return _bound(socket.AF_INET6, ("::", port), dual_stack=True)
            except OSError as exc:
                if exc.errno not in NO_IPV6:
                    raise
        return _bound(socket.AF_INET, ("0.0.0.0", port), dual_stack=False)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return _bound(family, (host, port), dual_stack=False)
