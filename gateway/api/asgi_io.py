"""Raw ASGI plumbing for the proxy endpoints: bounded body reads, responses, and disconnect watching.

The proxy endpoints are served as plain ASGI (no framework layers on the hot path). A client that goes
away while its request is running cancels the request's task (`DisconnectWatcher`), so the proxy's
`finally` closes the upstream connection at once and the engine stops generating.

`ClientIO` bounds what the client controls: a declared `Content-Length` over the limit is 413 before
any of the body is read; the body must arrive within `server.body_timeout_s` (408 `request_timeout`);
each write must be taken within `server.write_timeout_s` — a client that stops reading ends its request
as a disconnect (`ClientWriteTimeout`), so the serve path's `finally` releases the slot and closes the
upstream request, and the connection is dropped through the server's connection control (the
`CONNECTION_EXTENSION` scope extension of `gateway.api.connection_guard`) when there is one. Under that
server, an answer sent before the body was read whole carries `connection: close` (the server reads and
discards the rest for a few seconds, so the client can finish sending and read it); elsewhere the
server keeps the connection and discards the rest of the body itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import Any

from gateway.api.write_deadline import WriteDeadlines
from gateway.base.errors import PayloadTooLarge, RequestTimeout

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CONNECTION_EXTENSION = "llm_gateway.connection"
"""`scope["extensions"]` key of the server's connection control: an object with `abort()`, whose
server closes a connection answered before its request body was in with a lingering close."""


class ClientDisconnected(Exception):
    """The client closed the connection before the request body was complete."""


class ClientWriteTimeout(ClientDisconnected):
    """The client took nothing written to it for `server.write_timeout_s`: treated as gone."""


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


class ClientIO:
    """One request's client side: the body read within its limits, each write within its deadline.

    `send` is the ASGI send to hand on; `deadlines` the application's write deadlines; `on_timeout(phase)`
    counts a deadline that ended the request (`body` or `write`).
    """

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        deadlines: WriteDeadlines,
        on_timeout: Callable[[str], None],
    ) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send
        self._deadlines = deadlines
        self._on_timeout = on_timeout
        self._timed_out = False
        self._control: Any = (scope.get("extensions") or {}).get(CONNECTION_EXTENSION)
        self._sender: asyncio.Task[Any] | None = None
        self._write_expired = False
        self._cancelling = 0
        self.body_complete = header(scope, b"content-length") == "0" or (
            header(scope, b"content-length") is None and header(scope, b"transfer-encoding") is None
        )
        """The request body has been read whole (or there is none): the connection can be reused."""

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        """The whole body: `PayloadTooLarge` at once when the declared length exceeds `max_bytes` (or as
        soon as the body does), `RequestTimeout` when it is not all in within `timeout_s`."""
        declared = header(self._scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise PayloadTooLarge(
                f"the declared body of {int(declared)} bytes exceeds the limit of {max_bytes} bytes"
            )
        try:
            async with asyncio.timeout(timeout_s):
                body = await read_body(self._receive, max_bytes)
        except TimeoutError:
            self._on_timeout("body")
            raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
        self.body_complete = True
        return body

    async def send(self, message: Message) -> None:
        """Send `message` within the write deadline, else drop the connection and raise
        `ClientWriteTimeout` (later sends do nothing). The deadline is watched by the application's one
        timer (`WriteDeadlines`), not a timer per request or per send: a send costs a clock read, and
        nothing of the request stays reachable once it returns."""
        if self._timed_out:
            return
        if message["type"] == "http.response.start" and not self.body_complete and self._control is not None:
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        task = self._sender = asyncio.current_task()
        self._deadlines.begin(self)
        try:
            await self._send(message)
        except asyncio.CancelledError:
            if not self._write_expired or task is None or task.uncancel() > self._cancelling:
                raise
            self._timed_out = True
            self._on_timeout("write")
            if self._control is not None:
                self._control.abort()
            raise ClientWriteTimeout(f"the client read nothing for {self._deadlines.timeout_s:g} s") from None
        finally:
            self._deadlines.end(self)
            self._sender = None

    def write_expired(self) -> None:
        """The send under way has waited the whole deadline (`WriteDeadlines`): cancel its task."""
        task = self._sender
        if task is None or self._write_expired:
            return
        self._write_expired = True
        self._cancelling = task.cancelling()
        task.cancel()


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
