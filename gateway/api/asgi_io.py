"""Raw ASGI plumbing for the proxy endpoints: bounded body reads, responses, and disconnect watching.

The proxy endpoints are served as plain ASGI (no framework layers on the hot path). A client that goes
away while its request is running cancels the request's task (`DisconnectWatcher`), so the proxy's
`finally` closes the upstream connection at once and the engine stops generating.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import Any

from gateway.errors import PayloadTooLarge

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientDisconnected(Exception):
    """The client closed the connection before the request body was complete."""


def header(scope: Scope, name: bytes) -> str | None:
    """First value of request header `name` (lower-case bytes), decoded as latin-1."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def read_body(receive: Receive, max_bytes: int) -> bytes:
    """The whole request body; `PayloadTooLarge` as soon as it exceeds `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_response(send: Send, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    """A complete response in two ASGI messages, with content-length."""
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    raw_headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class DisconnectWatcher:
    """Cancels the current task when the client disconnects, and swallows exactly that cancellation.

    Use around the part of a request that waits on the upstream. Call `disarm()` just before sending the
    final body message: servers report `http.disconnect` once a response is complete, which is not a
    client leaving. `disconnected` tells the caller the client left (for accounting).
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[Any] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._armed = True
        self.disconnected = False

    def disarm(self) -> None:
        self._armed = False

    async def __aenter__(self) -> DisconnectWatcher:
        self._task = asyncio.current_task()
        self._watch = asyncio.create_task(self._wait_for_disconnect())
        return self

    async def _wait_for_disconnect(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                break
        if self._armed and self._task is not None:
            self.disconnected = True
            self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self._watch is not None:
            self._watch.cancel()
        if self.disconnected and exc_type is asyncio.CancelledError and self._task is not None:
            self._task.uncancel()
            return True
        return False
