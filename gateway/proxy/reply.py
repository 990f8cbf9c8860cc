"""The client side of one request: what has been sent back, and what was measured on the way.

One `Reply` per request, created at arrival (before anything is parsed, so even a 401 has its
request id and timing). It holds the ASGI `send` (wrapped by the idempotency recorder when the
response is stored), the disconnect watcher, whether the response has started (after that an error
can only be a terminal SSE event), the decision of the replica that answers (for the headers), and
the measurements accounting reads: queue wait, first output, usage.

`first_output_s` is when the client could first see generated output, from arrival: the first
content event of a stream (the time to first token, TTFT) or, for a non-streamed response, the
arrival of the whole body (the client sees nothing earlier, so that is its TTFT too). Times come from
the app's injected clock (`core.clock`), given at construction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

from core.clock import Clock
from gateway.api.asgi_io import DisconnectWatcher, Send
from gateway.base.errors import GatewayError
from router.types import Decision


@dataclass(slots=True, eq=False)
class Reply:
    """The client side of one request (see the module docstring)."""

    request_id: str
    send: Send
    clock: InitVar[Clock]
    started_s: float = field(init=False)
    """The clock's time at arrival."""
    watcher: DisconnectWatcher | None = None
    decision: Decision | None = None
    pool: str | None = None
    """The model of the pool serving the request (`x-gateway-pool`: a fallback pool's, after one)."""
    started: bool = False
    """The response's first message (status and headers) went out."""
    first_output_s: float | None = None
    usage: dict[str, Any] | None = None
    queue_wait_s: float = 0.0
    abort_error: GatewayError | None = None
    """Set by a shutdown that ends the request: the handler answers with it."""
    response_id: str | None = None
    """The stored response's id a Responses API answer carried (state affinity remembers its replica)."""
    before_end: Callable[[], Awaitable[None]] | None = None
    """Runs once, just before the response's last byte (`gateway.proxy.relay.finish_body`): Responses
    state affinity records the response id's replica there, so a client that chains on the id at once —
    through any gateway instance — finds the record."""
    status: int | None = None
    """The HTTP status the relayed response started with (None before it started, and for an idempotent
    replay or an error answer, which the relay does not send)."""

    _now_s: Callable[[], float] = field(init=False, repr=False)

    def __post_init__(self, clock: Clock) -> None:
        self._now_s = clock.now_s
        self.started_s = self._now_s()

    def elapsed_s(self) -> float:
        """Seconds since the request arrived."""
        return self._now_s() - self.started_s

    async def run_before_end(self) -> None:
        """Run `before_end` if it has not run yet."""
        hook, self.before_end = self.before_end, None
        if hook is not None:
            await hook()

    def mark_first_output(self) -> None:
        """Record the first output now (once; later calls keep the first)."""
        if self.first_output_s is None:
            self.first_output_s = self.elapsed_s()

    def response_headers(self, content_type: str) -> list[tuple[str, str]]:
        """Gateway response headers (DESIGN §4): request id, replica, route, queue time, Server-Timing."""
        headers = [("content-type", content_type), ("x-request-id", self.request_id)]
        if self.pool is not None:
            headers.append(("x-gateway-pool", self.pool))
        if self.decision is not None:
            headers.append(("x-gateway-replica", self.decision.replica_id))
            headers.append(("x-gateway-route", self.decision.header_value()))
        queue_ms = self.queue_wait_s * 1000
        headers.append(("x-gateway-queue-ms", f"{queue_ms:.0f}"))
        timing = f"queue;dur={queue_ms:.1f}"
        if self.first_output_s is not None:
            timing += f", upstream-ttft;dur={self.first_output_s * 1000:.1f}"
        headers.append(("server-timing", timing))
        return headers
