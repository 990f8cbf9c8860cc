"""Idle, trickling, oversized, flooding and non-reading clients against a gateway run the way `serve`
runs it (the runner's uvicorn config: the guarded protocol), over raw sockets on 127.0.0.1.

Small deadlines keep every test within a few seconds: headers and body 0.5 s, writes 0.5 s.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.api.connection_guard import BACKSTOP_GRACE_S
from gateway.api.connection_limit import EVICT_AFTER_S, connection_limits
from tests.integration.conftest import MODEL, pool
from tests.servers import GuardedGateway, ServerThread, gateway_settings, wait_until

Engines = Callable[..., ServerThread]
Gateways = Callable[[dict[str, Any]], ServerThread]
DEADLINE_S = 0.5
SERVER = {"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S, "write_timeout_s": DEADLINE_S}


Guarded = Callable[..., GuardedGateway]


@pytest.fixture
def guarded(mock_engines: Callable[..., ServerThread]) -> Iterator[Callable[..., GuardedGateway]]:
    started: list[GuardedGateway] = []

    def factory(engine: ServerThread | None = None, **server: Any) -> GuardedGateway:
        engine = engine or mock_engines(model=MODEL)
        raw = gateway_settings([pool([engine])])
        raw["server"] = {**raw["server"], **SERVER, **server}
        gateway = GuardedGateway(raw)
        started.append(gateway.start())  # type: ignore[arg-type]
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()


def _connect(gateway: ServerThread, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect: fixes the advertised window
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5.0)
    sock.connect(("127.0.0.1", gateway.port))
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (EOF or reset)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _request_head(length: int | str, path: str = "/v1/chat/completions") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


def _chat(stream: bool = False, max_tokens: int = 4) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    return json.dumps({**body, "stream": stream}).encode()


def test_a_silent_connection_is_closed_at_the_header_deadline(guarded: Guarded) -> None:
    gateway = guarded()
    sock = _connect(gateway)
    opened = time.monotonic()
    assert _read_all(sock) == b""  # closed without an answer: nothing was asked
    held_s = time.monotonic() - opened
    assert DEADLINE_S * 0.8 <= held_s < DEADLINE_S + 1.0, held_s
    assert gateway.metric("client_timeouts_total", phase="idle") == 1
    assert wait_until(lambda: gateway.metric("client_connections") == 0)


def _trickled_headers_answer(gateway: GuardedGateway) -> bytes:
    """What the gateway answers a request whose headers come a byte every 50 ms (then closes)."""
    sock = _connect(gateway)
    opened = time.monotonic()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    with contextlib.suppress(OSError):  # the server closes while we still trickle
        for byte in b"x-slow-header: " + b"a" * 40:
            sock.send(bytes([byte]))
            time.sleep(0.05)
            if time.monotonic() - opened > DEADLINE_S + 1.0:
                break
    return _read_all(sock)


def test_trickled_headers_get_408_and_the_connection_is_closed(guarded: Guarded) -> None:
    gateway = guarded()
    opened = time.monotonic()
    status, headers, body = _parse(_trickled_headers_answer(gateway))
    assert status == 408 and headers["x-gateway-reject-reason"] == "request_timeout"
    assert headers["connection"] == "close" and json.loads(body)["error"]["code"] == "request_timeout"
    assert time.monotonic() - opened < DEADLINE_S + 1.5
    assert gateway.metric("client_timeouts_total", phase="header") == 1


def test_the_header_timeout_408_carries_a_date_as_every_answer_does(guarded: Guarded) -> None:
    _, headers, _ = _parse(_trickled_headers_answer(guarded()))
    sent = email.utils.parsedate_to_datetime(headers["date"])
    assert abs((datetime.datetime.now(datetime.UTC) - sent).total_seconds()) < 5


def test_a_trickled_body_gets_408_within_the_body_deadline(guarded: Guarded) -> None:
    gateway = guarded()
    sock = _connect(gateway)
    body = _chat()
    sock.sendall(_request_head(len(body)))
    started = time.monotonic()
    with contextlib.suppress(OSError):
        for byte in body[:20]:
            sock.send(bytes([byte]))
            time.sleep(0.05)
    status, headers, answer = _parse(_read_all(sock))
    assert status == 408 and headers["x-gateway-reject-reason"] == "request_timeout"
    assert headers["connection"] == "close" and "x-request-id" in headers
    assert json.loads(answer)["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < DEADLINE_S + 1.5
    assert gateway.metric("client_timeouts_total", phase="body") == 1
    assert gateway.metric("requests_total", model="unknown", outcome="request_timeout") == 1
    assert gateway.metric("rejections_total", reason="request_timeout") == 1


def test_a_trickled_body_to_another_route_is_dropped_by_the_protocol_backstop(guarded: Guarded) -> None:
    gateway = guarded()
    sock = _connect(gateway)
    sock.sendall(_request_head(100, path="/v1/nowhere"))
    started = time.monotonic()
    with contextlib.suppress(OSError):
        for _ in range(60):
            sock.send(b"x")
            time.sleep(0.05)
    data = _read_all(sock)
    assert _parse(data)[0] == 404  # answered at once; the trickle that follows is cut off
    assert time.monotonic() - started < DEADLINE_S + BACKSTOP_GRACE_S + 1.0
    assert gateway.metric("client_timeouts_total", phase="body") == 1


def test_a_huge_declared_body_gets_413_before_any_of_it_is_sent(guarded: Guarded) -> None:
    gateway = guarded(body_timeout_s=30)
    sock = _connect(gateway)
    started = time.monotonic()
    sock.sendall(_request_head(10_000_000_000))
    status, headers, body = _parse(_read_all(sock))
    assert time.monotonic() - started < 1.0
    assert status == 413 and headers["x-gateway-reject-reason"] == "too_large"
    assert headers["connection"] == "close" and b"10000000000" in body


def test_a_client_that_sends_a_too_large_body_anyway_reads_its_413(guarded: Guarded) -> None:
    """The 413 goes out before the body is read; the server then reads and discards the rest before it
    closes (a lingering close), so a client still sending gets the answer, not a reset."""
    gateway = guarded()
    huge = b'{"model": "test-model", "prompt": "' + b"x" * (4 * 1024 * 1024 + 1) + b'"}'
    for _ in range(20):
        response = httpx.post(gateway.url + "/v1/completions", content=huge, timeout=10)
        assert response.status_code == 413 and response.headers["x-gateway-reject-reason"] == "too_large"
        assert response.headers["connection"] == "close"


def test_a_well_behaved_request_keeps_its_connection(guarded: Guarded) -> None:
    gateway = guarded()
    sock = _connect(gateway)
    for _ in range(2):  # two requests on one kept-alive connection, each well within the deadlines
        body = _chat()
        sock.sendall(_request_head(len(body)) + body)
        data = b""
        while b'"usage"' not in data:
            data += sock.recv(65536)
        status, headers, _ = _parse(data)
        assert status == 200 and "connection" not in headers
    sock.close()


def _half_sent(gateway: ServerThread) -> socket.socket:
    """A connection that began a request and stalls in its headers."""
    sock = _connect(gateway)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
    return sock


def _served(gateway: ServerThread, sock: socket.socket) -> int:
    body = _chat()
    sock.sendall(_request_head(len(body)) + body)
    data = b""
    while b'"usage"' not in data and b"\r\n\r\n{" not in data:
        data += sock.recv(65536)
    return _parse(data)[0]


def test_over_the_connection_limit_requests_get_503_with_retry_after(guarded: Guarded) -> None:
    gateway = guarded(header_timeout_s=3.0, max_connections=8)
    assert (gateway.guard.max_connections, gateway.guard.accept_ceiling) == (8, 10)
    held = [_half_sent(gateway) for _ in range(8)]  # the limit, held by stalled requests
    assert wait_until(lambda: gateway.metric("client_connections") == 8)
    over = _connect(gateway)  # the 9th: answered with a clear refusal
    body = _chat()
    over.sendall(_request_head(len(body)) + body)
    status, headers, answer = _parse(_read_all(over))
    assert status == 503 and headers["x-gateway-reject-reason"] == "connection_limit"
    assert 1 <= int(headers["retry-after"]) <= 3 and headers["connection"] == "close"
    assert json.loads(answer)["error"]["code"] == "connection_limit"
    probe = _connect(gateway)  # liveness is answered even over the limit
    probe.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert _parse(_read_all(probe))[0] == 200
    held += [_half_sent(gateway) for _ in range(2)]  # 9th and 10th: up to the accept ceiling
    assert wait_until(lambda: gateway.metric("client_connections") == 10), gateway.metric(
        "client_connections"
    )
    flood = _connect(gateway)  # the 11th: closed as soon as it is accepted
    assert _read_all(flood) == b""
    assert gateway.metric("client_connections_refused_total", stage="accept") == 1
    assert gateway.metric("client_connections_refused_total", stage="request") == 1
    for sock in held:
        sock.close()
    assert wait_until(lambda: gateway.metric("client_connections") == 0)
    assert _served(gateway, _connect(gateway)) == 200  # room again


def test_at_the_limit_a_new_connection_pushes_out_the_longest_silent_one(guarded: Guarded) -> None:
    gateway = guarded(header_timeout_s=3.0, max_connections=8)
    silent = [_connect(gateway) for _ in range(8)]  # a flood of connections that never send
    assert wait_until(lambda: gateway.metric("client_connections") == 8)
    time.sleep(EVICT_AFTER_S)  # a connection that has only just been accepted is not pushed out
    newcomers = [_connect(gateway) for _ in range(3)]
    for sock in newcomers:  # each newcomer is served: the oldest silent connection made room for it
        assert _served(gateway, sock) == 200
    assert gateway.metric("client_connections_refused_total", stage="evicted") == 3
    assert all(_read_all(sock) == b"" for sock in silent[:3])  # closed by the server
    assert gateway.metric("client_connections_refused_total", stage="request") == 0


def test_a_stream_whose_client_stops_reading_is_ended_at_the_write_deadline(
    guarded: Guarded, mock_engines: Engines
) -> None:
    engine = mock_engines(model=MODEL, first_token_delay_ms=1, token_delay_ms=0.02)
    gateway = guarded(engine)
    sock = _connect(gateway, rcvbuf=4096)
    body = _chat(stream=True, max_tokens=2_000_000)
    sock.sendall(_request_head(len(body)) + body)
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # the stream started; now we never read again
    stopped = time.monotonic()

    def ended() -> float:  # the write deadline, or the slow-reader rule when its window closes first
        return sum(gateway.metric("client_timeouts_total", phase=phase) for phase in ("write", "slow_read"))

    assert wait_until(lambda: ended() == 1, 15.0)
    released_s = time.monotonic() - stopped
    assert wait_until(lambda: gateway.inflight() == 0, 5.0)
    assert wait_until(lambda: engine.app.counters.active == 0, 5.0)
    assert engine.app.counters.aborted == 1 and engine.app.counters.finished == 0
    samples = gateway.metric("requests_total", model=MODEL, outcome="client_disconnect")
    assert samples == 1
    print(f"released {released_s:.2f} s after the client stopped reading")
    assert released_s < 10.0, released_s
    sock.settimeout(2.0)
    with pytest.raises(ConnectionResetError):  # dropped (reset), not left to flush for ever
        while sock.recv(65536):
            pass


def test_without_the_guarded_protocol_the_asgi_write_deadline_still_releases_the_slot(
    mock_engines: Engines, gateways: Gateways
) -> None:
    """Under plain uvicorn (no TCP progress watch) the deadline starts once the socket buffers are full."""
    engine = mock_engines(model=MODEL, first_token_delay_ms=1, token_delay_ms=0.02)
    raw = gateway_settings([pool([engine])])
    raw["server"] = {**raw["server"], **SERVER}
    gateway = gateways(raw)
    sock = _connect(gateway, rcvbuf=4096)
    body = _chat(stream=True, max_tokens=2_000_000)
    sock.sendall(_request_head(len(body)) + body)
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    state = gateway.app.state
    phase = {"phase": "write"}
    assert wait_until(
        lambda: state.metrics.registry.get_sample_value("llm_gateway_client_timeouts_total", phase) == 1, 20.0
    )
    assert wait_until(lambda: state.registry.total_inflight() == 0, 1.0)
    assert wait_until(lambda: engine.app.counters.active == 0, 5.0)
    assert engine.app.counters.aborted == 1 and engine.app.counters.finished == 0
    sock.close()


def test_the_connection_limit_is_at_most_half_the_file_limit() -> None:
    assert connection_limits(8192, None) == (8192, 10240)
    assert connection_limits(8192, 1024) == (512, 640)  # the default soft limit: 1,100 sockets are refused
    assert connection_limits(100, 1_048_576) == (100, 125)


def test_the_file_limit_is_raised_to_the_hard_limit() -> None:
    code = (
        "import resource\n"
        "from gateway.uvicorn_runner import raise_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "before, now = raise_file_limit()\n"
        "print(before, now, hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, now, hard = (int(x) for x in out.split())
    assert before == 256 and now == (hard if hard < 1 << 62 else now) and now > 256
