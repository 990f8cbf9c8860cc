"""Ports for the benchmark's child servers to listen on, chosen so that no outgoing connection takes one
between the choice and the child's bind.

A port bound to 0 comes from the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999
by default), the range every outgoing connection's local port comes from too. A fleet chooses its ports
first and starts its gateways only after every engine answers its readiness poll, and each poll is a new
connection on a new ephemeral port: one bench run in four failed here with the gateway's "address already
in use" (2026-12-06, four consecutive runs). Below the ephemeral range only another listener can take
a port, so `free_port` chooses there — at random in [`LOWEST_PORT`, the range's start), each candidate
checked by binding it — and falls back to the kernel's choice where the range is unknown (not Linux) or
leaves too little room below it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST_PORT = 10_000
"""Below this the well-known and registered services' ports crowd; nothing of ours listens there."""
MIN_ROOM = 1_000
"""The fewest ports below the ephemeral range worth choosing from; with fewer, the kernel chooses."""
TRIES = 64
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range of local ports for outgoing connections, None when it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kernel_port() -> int:
    """A port the kernel chooses (from the ephemeral range), free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port(rng: random.Random | None = None, path: Path = RANGE_FILE) -> int:
    """A port nothing listens on now, below the ephemeral range where there is room (module docstring).
    `rng`: the candidates' source (default: a fresh `random.Random()`; concurrent fleets must not choose
    alike)."""
    span = ephemeral_range(path)
    if span is None or span[0] - LOWEST_PORT < MIN_ROOM:
        return kernel_port()
    rng = rng or random.Random()
    for _ in range(TRIES):
        port = rng.randrange(LOWEST_PORT, span[0])
        if _bindable(port):
            return port
    return kernel_port()
