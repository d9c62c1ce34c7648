"""free_ports: distinct, bindable, and outside the range outgoing connections take their source ports from."""

from __future__ import annotations

import socket

from psflow.launch.ports import ephemeral_range, free_ports


def test_ports_are_distinct_bindable_and_not_ephemeral() -> None:
    low, high = ephemeral_range()
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(not low <= p <= high for p in ports), (ports, low, high)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out() -> None:
    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
    try:
        taken = set()
        for s, port in zip(held, free_ports(3), strict=True):
            s.bind(("127.0.0.1", port))
            taken.add(port)
        assert not taken & set(free_ports(50))
    finally:
        for s in held:
            s.close()
