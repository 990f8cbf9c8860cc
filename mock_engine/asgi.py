"""Plain-ASGI plumbing for the mock engine: reading bodies, answering, waiting with disconnect detection,
and resetting a connection (the crash fault)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_LINGER_RESET = struct.pack("ii", 1, 0)
DISCONNECT_WAIT_S = 1.0
DRAIN_WAIT_S = 0.5


class ClientGone(Exception):
    """The client disconnected."""


class InjectedCrash(Exception):
    """Raised when the transport cannot be reached: the ASGI server then drops the connection itself."""


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def send_body(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def reset_connection(receive: Receive, watcher: asyncio.Task[None]) -> None:
    """Reset the TCP connection of the current request: SO_LINGER 0 then abort sends an RST.

    uvicorn passes its per-request cycle's bound `receive`, whose owner holds the asyncio transport. Once the
    transport is aborted we wait for uvicorn to notice the disconnect, so it does not log an incomplete
    response. Without a reachable transport, `InjectedCrash` makes the server close the connection instead
    (a FIN: the client sees an incomplete body rather than ECONNRESET). Bytes already written are first
    given up to `DRAIN_WAIT_S` to reach the client, since a reset discards whatever the kernel still holds.
    """
    transport: Any = getattr(getattr(receive, "__self__", None), "transport", None)
    if not callable(getattr(transport, "abort", None)):  # uvloop's transports are not asyncio.Transport
        raise InjectedCrash
    sock = transport.get_extra_info("socket")
    await _drain(transport, sock, watcher)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()
    await asyncio.wait({watcher}, timeout=DISCONNECT_WAIT_S)


async def _drain(transport: Any, sock: Any, watcher: asyncio.Task[None]) -> None:
    """Wait until the transport's buffer and the kernel's send queue are empty (or the client left)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_WAIT_S
    while not watcher.done() and loop.time() < deadline:
        if transport.get_write_buffer_size() == 0 and _kernel_unsent(sock) == 0:
            return
        await asyncio.sleep(0.002)


def _kernel_unsent(sock: Any) -> int:
    """Bytes not yet acknowledged by the peer (Linux SIOCOUTQ); 0 when unknown."""
    if sock is None or not hasattr(termios, "TIOCOUTQ"):
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", raw)[0])
