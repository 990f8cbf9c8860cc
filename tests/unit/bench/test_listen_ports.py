"""The fleet's listening ports come from below the kernel's ephemeral range, where no outgoing
connection's local port can take one before the child binds it, and are free when chosen."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from bench.listen_ports import LOWEST_PORT, ephemeral_range, free_port


def _range_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


def test_ports_are_chosen_below_the_ephemeral_range_and_are_free(tmp_path: Path) -> None:
    path = _range_file(tmp_path, "32768\t60999\n")
    assert ephemeral_range(path) == (32768, 60999)
    ports = {free_port(random.Random(seed), path) for seed in range(20)}
    assert all(LOWEST_PORT <= port < 32768 for port in ports)
    assert len(ports) > 1  # chosen at random: concurrent fleets do not all try one port
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: nothing listens there


def test_a_port_someone_listens_on_is_not_chosen(tmp_path: Path) -> None:
    path = _range_file(tmp_path, "32768 60999")
    first_candidate = random.Random(7).randrange(LOWEST_PORT, 32768)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first_candidate))
        taken.listen()
        chosen = free_port(random.Random(7), path)
    assert chosen != first_candidate and LOWEST_PORT <= chosen < 32768


def test_the_kernel_chooses_where_the_range_is_unknown_or_leaves_no_room(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    assert ephemeral_range(missing) is None
    assert ephemeral_range(_range_file(tmp_path, "garbage")) is None
    real = ephemeral_range()
    for path in (missing, _range_file(tmp_path, f"{LOWEST_PORT + 500} 60999")):
        port = free_port(random.Random(1), path)
        if real is not None:  # the kernel's choice: from its own ephemeral range
            assert real[0] <= port <= real[1]
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
