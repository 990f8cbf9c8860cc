"""Client connections under uvicorn: the header deadline, a body-deadline backstop, the connection limit.

uvicorn (0.54) bounds only idle keep-alive connections (`timeout_keep_alive`, armed once a response is
complete): a connection that is opened and never sends, or sends its headers a byte at a time, is held
for ever; and its `limit_concurrency` answers 503 `text/plain` without `Retry-After` or a reason, only
once headers are complete, while accepting every connection until the file limit. `GuardedProtocol`, a
subclass of uvicorn's `HttpToolsProtocol` that the runner passes as uvicorn's `http`, adds (settings
under `server:`):

- **header deadline** (`header_timeout_s`), from the connection's opening, or from the first byte of a
  later request on a kept-alive connection, to the end of that request's headers. A connection that sent
  nothing is closed silently (phase `idle`); half-sent headers get 408 `request_timeout` with
  `connection: close` (phase `header`).
- **body deadline backstop**: the proxy endpoints bound their body themselves (`ClientIO.read_body`:
  408 with the request id, accounted); for any other route, a body still incomplete
  `BACKSTOP_GRACE_S` after `body_timeout_s` gets the same 408 (or the connection is dropped when a
  response has started).
- **connection limit** (`max_connections`, at most half the file limit; see `connection_limits`): over
  it, a new connection first pushes out the connection that has been silent longest (nothing sent since
  it was accepted, for `EVICT_AFTER_S`): a flood of idle sockets cannot lock out clients that send. With
  none to push out, a request is answered 503 `connection_limit` with a computed `Retry-After` and
  `connection: close` (probes and `/metrics` are still answered); above `ACCEPT_CEILING_RATIO` × the
  limit, a new connection is closed as soon as it is accepted (after pushing out the oldest silent one
  whatever its age, if there is one), so the file limit is never reached.
- **write deadline** (`write_timeout_s`), on Linux: while a response is being sent, the kernel's count
  of bytes the client acknowledged (TCP_INFO `tcpi_bytes_acked`) is sampled every quarter of the
  deadline; when bytes wait to be sent and none was acknowledged for `write_timeout_s`, the connection is
  reset and the request sees a disconnect (its upstream request is closed, its slot released). This
  does not wait for the gateway's own send buffer to fill (the kernel grows it to about 4 MB); the
  ASGI-level deadline (`gateway.api.asgi_io.ClientIO`, portable) only starts once it is full. Neither can
  see past the client's kernel: a client that stops reading still acknowledges until its receive
  buffer is full (100 KB to a few MB), so the deadline starts only then.
- **connection control**: `scope["extensions"][CONNECTION_EXTENSION]` is the protocol, whose `abort()`
  the ASGI write deadline calls to drop a connection whose client stopped reading (a plain close would
  wait for ever to flush the buffered bytes).

Everything is counted in `llm_gateway_client_timeouts_total{phase}`, `llm_gateway_client_connections`
and `llm_gateway_client_connections_refused_total{stage}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import sys
import termios
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.api.asgi_io import CONNECTION_EXTENSION, Receive, Scope, Send, send_response
from gateway.error_mapping import to_response
from gateway.errors import ConnectionLimit, GatewayError, RequestTimeout
from gateway.metrics import GatewayMetrics
from gateway.settings import ServerSettings

BACKSTOP_GRACE_S = 1.0
"""How long after `body_timeout_s` the protocol ends a body the application did not bound itself."""
ACCEPT_CEILING_RATIO = 1.25
"""Open connections, as a multiple of the limit, past which a new connection is closed at accept."""
EVICT_AFTER_S = 1.0
"""At the limit, a new connection closes the one silent longest if it has been silent this long."""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
LINGER_S = 1.0
"""How long a connection closed after a 408 may take to flush it before it is dropped."""
_LINGER_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: close() resets the connection and frees its buffers at once."""
_TCP_INFO_BYTES_ACKED = slice(120, 128)
"""`tcpi_bytes_acked` (u64, Linux ≥ 4.1) in `struct tcp_info`."""
WATCHES_WRITES = sys.platform == "linux" and hasattr(socket, "TCP_INFO") and hasattr(termios, "TIOCOUTQ")
ALWAYS_ANSWERED = frozenset({"/healthz", "/health", "/readyz", "/metrics"})
"""Paths answered even over the connection limit: a liveness probe must not fail under a flood."""


def connection_limits(configured: int, file_limit: int | None) -> tuple[int, int]:
    """The limit in force (`configured`, at most half `file_limit`) and the accept ceiling."""
    limit = configured if file_limit is None else max(1, min(configured, file_limit // 2))
    return limit, max(limit + 1, int(limit * ACCEPT_CEILING_RATIO))


def tcp_progress(sock: Any) -> tuple[int, int] | None:
    """(bytes the peer acknowledged, bytes in the kernel's send queue) of a TCP socket (Linux), or
    None when the kernel does not tell."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return None
    if len(info) < _TCP_INFO_BYTES_ACKED.stop:
        return None
    acked = int.from_bytes(info[_TCP_INFO_BYTES_ACKED], sys.byteorder)
    return acked, int.from_bytes(queued, sys.byteorder, signed=True)


def raw_response(error: GatewayError) -> bytes:
    """`error` as a complete HTTP/1.1 response that closes the connection (written by the protocol)."""
    answer = to_response(error)
    lines = [f"HTTP/1.1 {answer.status} {HTTPStatus(answer.status).phrase}"]
    lines += [f"{name}: {value}" for name, value in answer.headers]
    lines += [f"content-length: {len(answer.body)}", "connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + answer.body


@dataclass(eq=False)
class ConnectionGuard:
    """What every connection of one server shares: the deadlines, the limits, the metrics."""

    header_timeout_s: float
    body_timeout_s: float
    write_timeout_s: float
    max_connections: int
    accept_ceiling: int
    metrics: GatewayMetrics
    awaiting_headers: OrderedDict[int, float] = field(default_factory=OrderedDict)
    """Header deadlines by connection, oldest first (every deadline is its arming time + the timeout)."""
    silent: OrderedDict[int, tuple[float, GuardedProtocol]] = field(default_factory=OrderedDict)
    """Connections that have not sent a byte since they were accepted (with that time), oldest first."""

    def evict_silent(self, now: float, *, at_ceiling: bool = False) -> bool:
        """Close the connection silent longest, to make room; False when there is none to close. Below
        the accept ceiling only one silent for `EVICT_AFTER_S` (at most half the header timeout) goes:
        a client that has just connected is about to send."""
        if not self.silent:
            return False
        accepted_s, victim = next(iter(self.silent.values()))
        if not at_ceiling and now - accepted_s < min(EVICT_AFTER_S, self.header_timeout_s / 2):
            return False
        self.silent.popitem(last=False)
        self.metrics.client_connections_refused_total.labels("evicted").inc()
        victim.evict()
        return True

    @classmethod
    def from_settings(
        cls, server: ServerSettings, metrics: GatewayMetrics, file_limit: int | None
    ) -> ConnectionGuard:
        limit, ceiling = connection_limits(server.max_connections, file_limit)
        return cls(
            server.header_timeout_s, server.body_timeout_s, server.write_timeout_s, limit, ceiling, metrics
        )

    def retry_after_s(self, now: float) -> float:
        """When a connection should free: the next header deadline to pass, else a header timeout."""
        for deadline in self.awaiting_headers.values():
            return max(1.0, deadline - now)
        return self.header_timeout_s

    async def refuse_unless_probe(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """A request over the connection limit: 503 `connection_limit`, unless it is a probe."""
        if scope["path"] in ALWAYS_ANSWERED:
            await app(scope, receive, send)
            return
        retry_after_s = self.retry_after_s(asyncio.get_running_loop().time())
        error = ConnectionLimit(
            f"the gateway holds its limit of {self.max_connections} client connections",
            retry_after_s=retry_after_s,
        )
        self.metrics.client_connections_refused_total.labels("request").inc()
        self.metrics.rejections_total.labels(str(error.code)).inc()
        answer = to_response(error)
        await send_response(send, answer.status, [*answer.headers, ("connection", "close")], answer.body)


_HEADER_TIMEOUT = RequestTimeout("the request's headers did not arrive within the header deadline")
_BODY_TIMEOUT = RequestTimeout("the request's body did not arrive within the body deadline")


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guard's deadlines and limit (module docstring)."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._began = False
        """A byte of the current request has arrived (the header timer's phase: header, not idle)."""
        self._lost = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._acked = -1
        self._progress_s = 0.0

    # connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        guard.metrics.client_connections.inc()
        if len(self.connections) > guard.max_connections:
            guard.evict_silent(self.loop.time())
        if len(self.connections) > guard.accept_ceiling:
            guard.evict_silent(self.loop.time(), at_ceiling=True)
        if len(self.connections) > guard.accept_ceiling:
            guard.metrics.client_connections_refused_total.labels("accept").inc()
            transport.abort()
            return
        guard.silent[id(self)] = (self.loop.time(), self)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.guard.silent.pop(id(self), None)
        self.guard.metrics.client_connections.dec()
        self._cancel_header_timer()
        self._cancel_body_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drop the connection now with a reset (no flush: the bytes the client did not read are
        discarded, the kernel keeps nothing); the running request sees a disconnect."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.transport.abort()

    # parser callbacks

    def evict(self) -> None:
        """Close this silent connection now (to make room for a new one): it leaves the count at once."""
        self.connections.discard(self)
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.guard.silent.pop(id(self), None)
        self._began = True
        if self._header_timer is None:
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        self._began = False
        scope = cast(dict[str, Any], self.scope)
        (scope.get("extensions") or scope.setdefault("extensions", {}))[CONNECTION_EXTENSION] = self
        guard = self.guard
        app = self.app
        now = self.loop.time()
        while len(self.connections) > guard.max_connections and guard.evict_silent(now):
            pass
        if len(self.connections) > guard.max_connections:
            self.app = partial(guard.refuse_unless_probe, app)
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        if not self.pipeline and self.cycle is not None and self.cycle.more_body:
            self._body_timer = self.loop.call_later(
                guard.body_timeout_s + BACKSTOP_GRACE_S, self._body_expired
            )
        if WATCHES_WRITES and self._write_timer is None:
            self._acked, self._progress_s = -1, self.loop.time()
            self._write_timer = self.loop.call_later(self._write_tick_s(), self._write_tick)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel_body_timer()

    # timers

    def _arm_header_timer(self) -> None:
        timeout_s = self.guard.header_timeout_s
        self._header_timer = self.loop.call_later(timeout_s, self._header_expired)
        self.guard.awaiting_headers[id(self)] = self.loop.time() + timeout_s

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self.guard.awaiting_headers.pop(id(self), None)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _header_expired(self) -> None:
        self._header_timer = None
        self.guard.awaiting_headers.pop(id(self), None)
        if self._lost:
            return
        self.guard.metrics.client_timeouts_total.labels("header" if self._began else "idle").inc()
        in_response = self.cycle is not None and not self.cycle.response_complete
        if self._began and not in_response:
            self._close_with(raw_response(_HEADER_TIMEOUT))
        else:  # nothing to answer (silent), or a pipelined request behind a running response
            self.abort()

    def _body_expired(self) -> None:
        self._body_timer = None
        if self._lost:
            return
        self.guard.metrics.client_timeouts_total.labels("body").inc()
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            self.abort()
            return
        cycle.disconnected = True  # the application's receive() now answers http.disconnect
        cycle.message_event.set()
        self._close_with(raw_response(_BODY_TIMEOUT))

    def _write_tick_s(self) -> float:
        return self.guard.write_timeout_s / 4

    def _write_tick(self) -> None:
        """Sample the client's progress while a response is under way (module docstring)."""
        self._write_timer = None
        cycle = self.cycle
        if self._lost or cycle is None or cycle.response_complete:
            return  # re-armed by the next request's headers
        progress = tcp_progress(self.transport.get_extra_info("socket"))
        if progress is None:
            return
        acked, queued = progress
        now = self.loop.time()
        if acked != self._acked or queued + self.transport.get_write_buffer_size() == 0:
            self._acked, self._progress_s = acked, now
        elif now - self._progress_s >= self.guard.write_timeout_s:
            self.guard.metrics.client_timeouts_total.labels("write").inc()
            self.abort()
            return
        self._write_timer = self.loop.call_later(self._write_tick_s(), self._write_tick)

    def _close_with(self, response: bytes) -> None:
        """Write `response`, close, and drop the connection if it is not flushed within `LINGER_S`."""
        self.transport.write(response)
        self.transport.close()
        self.loop.call_later(LINGER_S, self._drop_if_open)

    def _drop_if_open(self) -> None:
        if not self._lost:
            self.transport.abort()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """A `GuardedProtocol` class bound to `guard`, for uvicorn's `http` option."""
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": guard})
