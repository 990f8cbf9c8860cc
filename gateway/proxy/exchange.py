"""The state of one proxied request, shared by the attempt loop, the relays and the handler.

`release()` is the single release path of every resource a request holds (in-flight guard, upstream
response); the handler calls it in `finally`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.api.asgi_io import DisconnectWatcher, Send
from gateway.api.request_parsing import ParsedRequest
from gateway.errors import GatewayError
from gateway.upstream.registry import Pool
from gateway.upstream.replica import InflightGuard
from router.types import Decision


@dataclass(slots=True)
class Exchange:
    request_id: str
    send: Send
    started_s: float = field(default_factory=time.perf_counter)
    parsed: ParsedRequest | None = None
    pool: Pool | None = None
    watcher: DisconnectWatcher | None = None
    decision: Decision | None = None
    guard: InflightGuard | None = None
    response: aiohttp.ClientResponse | None = None
    response_started: bool = False
    ttft_s: float | None = None
    usage: dict[str, Any] | None = None
    attempts: int = 0
    attempt_started_s: float = 0.0
    queue_wait_s: float = 0.0
    abort_error: GatewayError | None = None
    tenant: str | None = None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started_s

    def attempt_elapsed_s(self) -> float:
        """Time since the current upstream attempt started (its first-token deadline runs from there)."""
        return time.perf_counter() - self.attempt_started_s

    def response_headers(self, content_type: str) -> list[tuple[str, str]]:
        """Gateway response headers (DESIGN §4): request id, replica, route, queue time, Server-Timing."""
        headers = [("content-type", content_type), ("x-request-id", self.request_id)]
        if self.decision is not None:
            headers.append(("x-gateway-replica", self.decision.replica_id))
            headers.append(("x-gateway-route", self.decision.header_value()))
        queue_ms = self.queue_wait_s * 1000
        headers.append(("x-gateway-queue-ms", f"{queue_ms:.0f}"))
        timing = f"queue;dur={queue_ms:.1f}"
        if self.ttft_s is not None:
            timing += f", upstream-ttft;dur={self.ttft_s * 1000:.1f}"
        headers.append(("server-timing", timing))
        return headers

    def swap_guard(self, guard: InflightGuard) -> None:
        """Hold `guard`, releasing the one from a previous attempt."""
        if self.guard is not None:
            self.guard.release()
        self.guard = guard
        self.attempt_started_s = time.perf_counter()

    def release(self) -> None:
        """Release the in-flight guard and close the upstream response: a response read to its end has
        already returned its connection to the pool; an unfinished one is closed, which aborts the
        generation on the engine (the client left, or the attempt failed)."""
        if self.guard is not None:
            self.guard.release()
        response, self.response = self.response, None
        if response is not None:
            response.close()
