"""The front's port (openai/listen.py): while a worker serves, no process of another UID can listen on OPENAI_PORT on
any local address, IPv4 or IPv6, and clients reach it over both."""

from __future__ import annotations

import os
import socket

import pytest

from harness.other_uid import NOBODY, bind_as
from trtllm_entrypoint.openai import listen

pytestmark = pytest.mark.process

ADDRESSES = [
    (socket.AF_INET6, "::1"),
    (socket.AF_INET6, "::"),
    (socket.AF_INET, "127.0.0.1"),
    (socket.AF_INET, "0.0.0.0"),
]


def ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="taking another UID needs root")


@needs_root
@pytest.mark.skipif(not ipv6(), reason="this kernel has no IPv6: nobody can listen on ::1 (listen.py falls back)")
@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("family,host", ADDRESSES)
def test_no_other_uid_can_listen_on_the_port_on_any_local_address(family, host, reuse):
    with listen.listening_socket("0.0.0.0", 0) as serving:
        port = serving.getsockname()[1]
        assert bind_as(NOBODY, family, host, port, reuse=reuse) != 0, f"UID {NOBODY} listens on {host}:{port}"


@needs_root
@pytest.mark.skipif(not ipv6(), reason="this kernel has no IPv6")
def test_an_ipv4_only_wildcard_would_leave_the_ipv6_side_to_any_uid():
    """Why the wildcard is dual-stack: the check above catches a front that binds 0.0.0.0 only."""
    with socket.socket(socket.AF_INET) as ipv4_only:
        ipv4_only.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        ipv4_only.bind(("0.0.0.0", 0))
        ipv4_only.listen()
        assert bind_as(NOBODY, socket.AF_INET6, "::1", ipv4_only.getsockname()[1], reuse=False) == 0


@pytest.mark.parametrize("client", ["127.0.0.1", "::1"])
def test_clients_reach_the_wildcard_over_ipv4_and_ipv6(client):
    if client == "::1" and not ipv6():
        pytest.skip("this kernel has no IPv6")
    with listen.listening_socket("0.0.0.0", 0) as serving:
        serving.setblocking(True)
        port = serving.getsockname()[1]
        with socket.create_connection((client, port), timeout=5):
            accepted, _ = serving.accept()
            accepted.close()


def test_the_workers_share_the_port():
    with listen.listening_socket("", 0) as first, listen.listening_socket("::", first.getsockname()[1]) as second:
        assert first.getsockname()[1] == second.getsockname()[1]


def test_without_ipv6_the_wildcard_is_ipv4(monkeypatch):
    monkeypatch.setattr(socket, "has_ipv6", False)
    with listen.listening_socket("0.0.0.0", 0) as serving:
        assert serving.family == socket.AF_INET


def test_a_named_address_is_bound_as_given():
    with listen.listening_socket("127.0.0.1", 0) as serving:
        assert serving.getsockname()[0] == "127.0.0.1"
