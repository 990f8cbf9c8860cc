"""The client connections of one server, as every connection's protocol sees them (`ConnectionGuard`):
the deadlines, the connection limit in force (`max_connections`, at most half the file limit) and the
accept ceiling above it, the eviction of the connection silent longest to make room, and the 503
`connection_limit` with a computed `Retry-After` for a request over the limit (probes and `/metrics`
still answered). The per-connection half — the timers, the write watch, the lingering close — is
`gateway.api.connection_guard.GuardedProtocol`; this is the state they share and the rules that read it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.api.asgi_io import Receive, Scope, Send, send_response
from gateway.base.error_mapping import to_response
from gateway.base.errors import ConnectionLimit
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import ServerSettings

ACCEPT_CEILING_RATIO = 1.25
"""Open connections, as a multiple of the limit, past which a new connection is closed at accept."""
EVICT_AFTER_S = 1.0
"""At the limit, a new connection closes the one silent longest if it has been silent this long."""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ALWAYS_ANSWERED = frozenset({"/healthz", "/health", "/readyz", "/metrics"})
"""Paths answered even over the connection limit: a liveness probe must not fail under a flood."""


class Evictable(Protocol):
    """A connection the guard may close to make room (`GuardedProtocol`)."""

    def evict(self) -> None: ...


def connection_limits(configured: int, file_limit: int | None) -> tuple[int, int]:
    """The limit in force (`configured`, at most half `file_limit`) and the accept ceiling."""
    limit = configured if file_limit is None else max(1, min(configured, file_limit // 2))
    return limit, max(limit + 1, int(limit * ACCEPT_CEILING_RATIO))


@dataclass(eq=False)
class ConnectionGuard:
    """What every connection of one server shares: the deadlines, the limits, the metrics."""

    header_timeout_s: float
    body_timeout_s: float
    write_timeout_s: float
    max_connections: int
    accept_ceiling: int
    metrics: GatewayMetrics
    min_read_bytes_per_s: float = 0.0
    awaiting_headers: OrderedDict[int, float] = field(default_factory=OrderedDict)
    """Header deadlines by connection, oldest first (every deadline is its arming time + the timeout)."""
    silent: OrderedDict[int, tuple[float, Evictable]] = field(default_factory=OrderedDict)
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
            server.header_timeout_s,
            server.body_timeout_s,
            server.write_timeout_s,
            limit,
            ceiling,
            metrics,
            min_read_bytes_per_s=server.min_read_bytes_per_s,
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
