"""Free ports on the local machine, for launchers and tests."""

from __future__ import annotations

import random
import socket

__all__ = ["free_ports", "ephemeral_range"]

_LOWEST = 10_000  # below this are well-known and registered services' ports


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the source ports of outgoing connections (Linux; else the IANA range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago, outside the ephemeral range.

    Ports handed out by binding port 0 come from the kernel's ephemeral range,
    the same range outgoing connections take their source ports from: between
    choosing such a port and a task binding it, any connection (a liveness
    ping, a gRPC channel) could take it. So ports are drawn at random from
    below that range and each is checked by binding it; all are held at once,
    so they are distinct, then released. (Another process could still bind
    one in between; a task that cannot bind its port fails with a clear error.)
    """
    low, _ = ephemeral_range()
    candidates = range(_LOWEST, low) if low - _LOWEST >= 4 * count + 100 else range(1024, 65536)
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for port in rng.sample(candidates, min(len(candidates), 50 * count + 200)):
            if len(socks) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < count:  # a crowded machine: let the kernel choose
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
