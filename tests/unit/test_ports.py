"""Ports: a fleet never gives two processes one port, and a service never shares a port it did
not get to itself (SO_REUSEPORT off: the kernel would hand each new connection to either)."""
from __future__ import annotations

import pytest

from fastvideo3.errors import Unavailable
from fleet.launcher import free_port
from services.common.server import ServiceHost


def test_free_port_never_hands_out_a_port_twice():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_second_service_on_a_taken_port_fails_to_listen():
    first = ServiceHost(["fastvideo3.v1.RolePool"], "127.0.0.1", 0)
    port = first.start()
    try:
        second = ServiceHost(["fastvideo3.v1.RolePool"], "127.0.0.1", port)
        with pytest.raises(Unavailable, match=f"cannot listen on 127.0.0.1:{port}") as e:
            second.start()
        assert e.value.field == "port"
        second.server.stop(None).wait(5.0)
    finally:
        first.server.stop(None).wait(5.0)
