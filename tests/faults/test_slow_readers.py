"""Slow readers (issue 28, item 4): a client that keeps reading (and acknowledging), but far slower
than the engine writes, no longer holds its engine slot until `timeouts.total_s` (off by default); a
slow but legitimate client (a mobile link's rate) is not cut.

Raw sockets on 127.0.0.1 reading a few bytes at a time at a fixed pace, against a gateway run as
`serve` runs it (the guarded protocol, whose TCP samples judge the read rate). The slow reader's
receive buffer is the kernel's minimum, so its kernel cannot absorb the stream and it acknowledges as it
reads (about 1.1 KB every 2 s, well within the window). The default `server.min_read_bytes_per_s`
(1024); `write_timeout_s` 5 s, the window it is judged over, keeps the rows to seconds.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.conftest import MATRIX
from tests.integration.conftest import MODEL, pool
from tests.integration.test_client_abuse import GuardedGateway
from tests.servers import ServerThread, gateway_settings, wait_until

Engines = Callable[..., ServerThread]
WINDOW_S = 5.0
SLOW = (128, 0.2)  # bytes per read, seconds between reads: 640 B/s
MOBILE = (4096, 0.25)  # 16 KB/s, a slow mobile link


def _settings(engine: ServerThread) -> dict[str, Any]:
    raw = gateway_settings([pool([engine], scrape={"enabled": False})])
    raw["server"] = {**raw["server"], "write_timeout_s": WINDOW_S}
    return raw


@pytest.fixture
def guarded() -> Iterator[Callable[[ServerThread], ServerThread]]:
    started: list[ServerThread] = []

    def factory(engine: ServerThread) -> ServerThread:
        gateway = GuardedGateway(_settings(engine)).start()
        started.append(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()


def _stream(gateway: ServerThread, max_tokens: int, rcvbuf: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: a fixed window
    sock.settimeout(5.0)
    sock.connect(("127.0.0.1", gateway.port))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    raw = json.dumps({**body, "stream": True}).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    sock.sendall(f"{head}content-length: {len(raw)}\r\n\r\n".encode() + raw)
    return sock


def _read_at(sock: socket.socket, pace: tuple[int, float], until_s: float) -> tuple[bytes, str]:
    """Read `pace[0]` bytes every `pace[1]` s until the stream ends, the server cuts it, or `until_s`."""
    size, every_s = pace
    data = b""
    deadline = time.monotonic() + until_s
    with contextlib.suppress(ConnectionResetError):
        while time.monotonic() < deadline:
            chunk = sock.recv(size)
            if not chunk:
                return data, "closed"
            data += chunk
            if data.endswith(b"data: [DONE]\n\n") or b"0\r\n\r\n" in data[-16:]:
                return data, "done"
            time.sleep(every_s)
        return data, "still open"
    return data, "reset"


def _slow_reads(gateway: ServerThread) -> float:
    value = gateway.app.state.metrics.registry.get_sample_value(
        "llm_gateway_client_timeouts_total", {"phase": "slow_read"}
    )
    return 0.0 if value is None else float(value)


def test_a_reader_far_slower_than_the_engine_is_cut_and_its_slot_freed(
    mock_engines: Engines, guarded: Callable[[ServerThread], ServerThread]
) -> None:
    """A 1 ms/token stream of two million tokens read at 640 B/s: never silent for the write deadline,
    yet the gateway resets it within a few windows; the request ends as a client disconnect, the slot
    and the engine's work are released."""
    engine = mock_engines(model=MODEL, first_token_delay_ms=1, token_delay_ms=1)
    gateway = guarded(engine)
    sock = _stream(gateway, 2_000_000, rcvbuf=1)
    started = time.monotonic()
    received, how = _read_at(sock, SLOW, until_s=15.0)
    cut_after_s = time.monotonic() - started
    sock.close()
    MATRIX["slow reader, 640 B/s against 1 ms/token"] = Counter(
        {"client_disconnect" if how != "done" else "ok": 1}
    )
    assert how in {"reset", "closed"}, (how, len(received))
    assert received.startswith(b"HTTP/1.1 200"), "the stream had started"
    assert _slow_reads(gateway) == 1, "the read rate, not the write deadline, ended it"
    assert cut_after_s < 2 * WINDOW_S, cut_after_s
    state = gateway.app.state
    assert wait_until(lambda: state.registry.total_inflight() == 0, 2.0), "the slot is freed"
    assert wait_until(lambda: engine.app.counters.active == 0, 5.0), "the engine stopped generating"
    assert engine.app.counters.aborted == 1 and engine.app.counters.finished == 0
    outcome = {"model": MODEL, "outcome": "client_disconnect"}
    assert state.metrics.registry.get_sample_value("llm_gateway_requests_total", outcome) == 1


def test_a_slow_but_legitimate_reader_gets_its_whole_stream(
    mock_engines: Engines, guarded: Callable[[ServerThread], ServerThread]
) -> None:
    """The same fast engine read at a mobile link's 16 KB/s: held back by the client the whole time,
    never cut; the stream ends with [DONE]."""
    engine = mock_engines(model=MODEL, first_token_delay_ms=1, token_delay_ms=1)
    gateway = guarded(engine)
    sock = _stream(gateway, 800, rcvbuf=16384)
    started = time.monotonic()
    received, how = _read_at(sock, MOBILE, until_s=20.0)
    took_s = time.monotonic() - started
    sock.close()
    MATRIX["mobile-rate reader, 16 KB/s against 1 ms/token"] = Counter({"ok" if how == "done" else how: 1})
    assert how == "done", (how, len(received))
    assert took_s > 2 * WINDOW_S, f"held back by the client over several windows ({took_s:.1f} s)"
    assert _slow_reads(gateway) == 0
    assert engine.app.counters.finished == 1
