"""Client connections under uvicorn: header deadline, body-deadline backstop, write watch, connection limit.

uvicorn (0.54) bounds only idle keep-alive connections (`timeout_keep_alive`, armed once a response is
complete): a connection that never sends, or sends its headers a byte at a time, is held for ever, and
its `limit_concurrency` answers 503 `text/plain` without `Retry-After` or reason once headers are in,
while accepting connections up to the file limit. `GuardedProtocol`, a subclass of its httptools
protocol that the runner passes as uvicorn's `http`, adds (settings under `server:`):

- **header deadline** (`header_timeout_s`) from the connection's opening, or the first byte of a later
  request on a kept-alive one, to the end of the headers: a silent connection is closed (phase `idle`),
  half-sent headers get 408 `request_timeout` and a close (phase `header`).
- **body backstop**: the proxy endpoints bound their body themselves (`ClientIO.read_body`); on any
  route a body still incomplete `BACKSTOP_GRACE_S` after `body_timeout_s` gets 408 (or, once a response
  has started, the connection is dropped).
- **lingering close**: a connection answered before its request body was in (413 from the declared
  length, 401, a refusal) sends the answer, ends our side, and reads and discards the rest of the body
  for up to `LINGERING_CLOSE_S`: closing with the client's bytes unread would reset the connection and
  could destroy the answer before the client, still sending, reads it.
- **connection limit** (`max_connections`, at most half the file limit): a new connection over it
  first pushes out the connection silent longest (nothing sent for `EVICT_AFTER_S`), so idle sockets
  cannot lock out clients that send; with none to push out, requests get 503 `connection_limit` with a
  computed `Retry-After` (probes and `/metrics` are still answered); above `ACCEPT_CEILING_RATIO` × the
  limit a new connection is closed when accepted, so the file limit is never reached.
- **write watch** (`write_timeout_s`, Linux): while a response is under way, TCP_INFO's
  `tcpi_bytes_acked` is sampled every quarter of the deadline; when bytes wait and none was acknowledged
  for the deadline, the connection is reset and the request sees a disconnect (upstream closed, slot
  released). It does not wait for the gateway's send buffer to fill (up to about 4 MB), as the portable
  ASGI deadline (`gateway.api.asgi_io.ClientIO`) does; neither sees past the client's kernel, which
  acknowledges until its receive buffer is full. The samples also bound a slow reader: when the kernel
  held unsent bytes (`tcpi_notsent_bytes`: the client's window or link is the limit) at every sample
  for `write_timeout_s`, less than `min_read_bytes_per_s` × that time acknowledged resets the
  connection the same way (phase `slow_read`); bytes in flight to a client that keeps up (a slow
  engine's) are not unsent.
- **connection control**: `scope["extensions"][CONNECTION_EXTENSION]` is the protocol; `ClientIO` calls
  its `abort()` to reset a connection whose client stopped reading (a close would wait to flush).

The state every connection shares (limit, eviction, the 503) is `gateway.api.connection_limit`.

Counted in `llm_gateway_client_timeouts_total{phase}`, `llm_gateway_client_connections` and
`llm_gateway_client_connections_refused_total{stage}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from http import HTTPStatus
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.api.asgi_io import CONNECTION_EXTENSION
from gateway.api.connection_limit import ConnectionGuard
from gateway.api.tcp_socket import WATCHES_WRITES, reset_on_close, tcp_progress
from gateway.api.write_watch import WriteWatch
from gateway.base.error_mapping import to_response
from gateway.base.errors import GatewayError, RequestTimeout

BACKSTOP_GRACE_S = 1.0
"""How long after `body_timeout_s` the protocol ends a body the application did not bound itself."""
LINGERING_CLOSE_S = 5.0
"""How long the rest of a request body answered early (413, 401, 503) is read and discarded before
the connection is dropped, so the client can finish sending and read the answer (nginx lingers 5 s)."""
LINGER_S = 1.0
"""How long a connection closed after a 408 may take to flush it before it is dropped."""


def raw_response(error: GatewayError, default_headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """`error` as a complete HTTP/1.1 response that closes the connection (written by the protocol),
    with the server's `default_headers` first (uvicorn's: `date`, and any configured), as every
    response that goes through the application has them."""
    answer = to_response(error)
    lines = [f"HTTP/1.1 {answer.status} {HTTPStatus(answer.status).phrase}"]
    lines += [f"{name.decode('latin-1')}: {value.decode('latin-1')}" for name, value in default_headers]
    lines += [f"{name}: {value}" for name, value in answer.headers]
    lines += [f"content-length: {len(answer.body)}", "connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + answer.body


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
        self._lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._watch = WriteWatch(self.guard.write_timeout_s, self.guard.min_read_bytes_per_s)

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
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drop the connection now with a reset (no flush: the bytes the client did not read are
        discarded, the kernel keeps nothing); the running request sees a disconnect."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        reset_on_close(self.transport.get_extra_info("socket"))
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
            self.cycle.transport = cast(asyncio.Transport, _LingeringClose(self))
        if WATCHES_WRITES and self._write_timer is None:
            self._watch.restart(self.loop.time())
            self._write_timer = self.loop.call_later(self._write_tick_s(), self._write_tick)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel_body_timer()
        cycle = self.cycle
        if cycle is not None and isinstance(cycle.transport, _LingeringClose):
            cycle.transport = self.transport  # the body is in: writes go straight to the transport
        if self._lingering:
            self.transport.close()  # the client sent its whole body: nothing unread, a clean close

    def close_lingering(self) -> None:
        """Close after an answer sent before the request body was in (413 from the declared length,
        401, a refusal): closing with the client's bytes unread would reset the connection and could
        destroy the answer in the client's buffers before it reads it (it is still sending). So: end
        our side after the answer (FIN), read and discard the body, and close when it is in or after
        `LINGERING_CLOSE_S`."""
        transport = self.transport
        if self._lost or self._lingering or transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._lingering = True
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(LINGERING_CLOSE_S, self.abort)

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
            self._close_with(raw_response(_HEADER_TIMEOUT, self.server_state.default_headers))
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
        self._close_with(raw_response(_BODY_TIMEOUT, self.server_state.default_headers))

    def _write_tick_s(self) -> float:
        return self.guard.write_timeout_s / 4

    def _write_tick(self) -> None:
        """Sample the client's progress while a response is under way (module docstring)."""
        self._write_timer = None
        cycle = self.cycle
        if self._lost or cycle is None or cycle.response_complete:
            return  # re-armed by the next request's headers
        sock = self.transport.get_extra_info("socket")
        progress = None if sock is None else tcp_progress(sock)
        if progress is None:
            return  # not TCP, or the kernel does not tell: the ASGI write deadline still holds
        acked, queued, unsent = progress
        buffered = self.transport.get_write_buffer_size()
        verdict = self._watch.sample(
            self.loop.time(), acked=acked, in_flight=queued, unsent=unsent, buffered=buffered
        )
        if verdict is not None:
            self.guard.metrics.client_timeouts_total.labels(verdict).inc()
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


class _LingeringClose:
    """The transport as a request's cycle sees it while the request body is still arriving: a close
    then is a lingering close (`GuardedProtocol.close_lingering`); everything else is the transport's."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: GuardedProtocol) -> None:
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol.transport, name)

    def close(self) -> None:
        self._protocol.close_lingering()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """A `GuardedProtocol` class bound to `guard`, for uvicorn's `http` option."""
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": guard})
