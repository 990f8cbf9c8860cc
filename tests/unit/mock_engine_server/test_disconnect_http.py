"""A client that leaves mid-stream aborts its request in the engine promptly, even when tokens come
faster than the connection drains (the generation loop must not outrun the disconnect)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import orjson
import pytest

from mock_engine.asgi import ClientGone
from mock_engine.core import TokenEvent
from mock_engine.streaming import _next_event
from tests.servers import ServerThread

from .conftest import CHAT, chat_body, stats, wait_until

Engine = Callable[..., ServerThread]
pytestmark = pytest.mark.timeout(30)


def _open_stream(server: ServerThread, max_tokens: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    body = orjson.dumps(chat_body(max_tokens=max_tokens))
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")
    return sock


def test_a_client_that_leaves_a_fast_stream_is_aborted_at_once(engine: Engine) -> None:
    # 0.02 ms per token: 2,000,000 tokens would run for 40 s if the loop did not see the client go
    server = engine(token_delay_ms=0.02, max_tokens=2_000_000)
    sock = _open_stream(server, 2_000_000)
    time.sleep(3.0)  # the socket buffers fill; the engine queues tokens behind the flow control
    sock.close()
    left = time.monotonic()
    assert wait_until(lambda: stats(server.url)["active"] == 0, 3.0), stats(server.url)
    counters = stats(server.url)
    assert (counters["aborted"], counters["finished"]) == (1, 0), counters
    print(f"aborted {time.monotonic() - left:.3f} s after the client left")  # 0.05-0.1 s; 0.4-0.75 before


async def test_the_next_token_is_not_taken_once_the_client_has_left() -> None:
    """Deterministic form of the above: with tokens queued and the watcher done, no token is emitted."""
    queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
    queue.put_nowait(TokenEvent("r1", index=0, time_s=0.0, finished=False))
    watcher = asyncio.create_task(asyncio.sleep(0))
    await watcher  # the disconnect watcher has seen the client leave
    with pytest.raises(ClientGone):
        await _next_event(queue, watcher)
    assert queue.qsize() == 1
