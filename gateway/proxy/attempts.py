"""One upstream attempt: route, claim the replica, send, and classify what came back.

`UpstreamOpener.attempt` leaves `exchange.response` open on a 2xx answer, or raises:
- `UpstreamConnectError` when the replica cannot be reached,
- `StaleConnection` when the request hit a keep-alive connection the engine had already closed and no
  byte came back (retried once on a fresh connection, not held against the replica),
- `UpstreamTTFTTimeout` when a stream's headers do not arrive within the first-token deadline,
- `UpstreamStatusError` with the engine's status, body and Retry-After for an error status.
The retry loop that calls it lives in the handler; the policy in `gateway.proxy.retry_policy`.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from gateway.errors import UpstreamConnectError, UpstreamStatusError, UpstreamTTFTTimeout
from gateway.metrics import GatewayMetrics
from gateway.proxy.exchange import Exchange
from gateway.proxy.timers import RequestTimers
from gateway.upstream.registry import Pool
from gateway.upstream.replica import Replica
from router.types import Decision, RoutingRequest

MAX_ERROR_BODY_BYTES = 64 * 1024
_FORWARDED_HEADERS = (b"authorization", b"accept", b"user-agent")


class StaleConnection(Exception):
    """The engine closed a pooled keep-alive connection before answering (nothing was generated)."""


def _retry_after_s(response: aiohttp.ClientResponse) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class UpstreamOpener:
    """Routing decisions and single attempts for the handler's retry loop."""

    def __init__(self, session: aiohttp.ClientSession, metrics: GatewayMetrics) -> None:
        self._session = session
        self._metrics = metrics

    def decide(self, pool: Pool, routing: RoutingRequest) -> Decision | None:
        started = time.perf_counter()
        decision = pool.policy.decide(routing, pool.snapshot())
        self._metrics.routing_decision_seconds.observe(time.perf_counter() - started)
        if decision is not None:
            self._metrics.routing_decisions_total.labels(decision.policy, decision.branch).inc()
        return decision

    async def attempt(
        self,
        exchange: Exchange,
        replica: Replica,
        *,
        body: bytes,
        headers: dict[str, str],
        timers: RequestTimers,
    ) -> None:
        """One attempt on `replica`, whose slot the caller already holds in `exchange.guard`."""
        exchange.attempts += 1
        rid = replica.replica_id
        try:
            response = await self._send(replica.url, exchange, body, headers, timers)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            raise UpstreamConnectError(f"could not connect to replica {rid}", replica_id=rid) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            raise StaleConnection(rid) from None
        except TimeoutError:
            raise UpstreamTTFTTimeout(
                f"no response from replica {rid} within the first-token deadline of {timers.ttft_s} s",
                replica_id=rid,
            ) from None
        if response.status >= 400:
            raise await self._status_error(response, rid)
        exchange.response = response

    async def _send(
        self, url: str, exchange: Exchange, body: bytes, headers: dict[str, str], timers: RequestTimers
    ) -> aiohttp.ClientResponse:
        assert exchange.parsed is not None
        streaming = exchange.parsed.stream
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timers.connect_s,
            sock_connect=timers.connect_s,
            sock_read=timers.idle_s if streaming else timers.nonstream_s,
        )
        request = self._session.post(
            url + exchange.parsed.endpoint.value, data=body, headers=headers, timeout=timeout
        )
        if not streaming:
            return await request
        async with asyncio.timeout(timers.ttft_s - exchange.attempt_elapsed_s()):
            return await request

    async def _status_error(self, response: aiohttp.ClientResponse, replica_id: str) -> UpstreamStatusError:
        try:
            body = await response.content.read(MAX_ERROR_BODY_BYTES)
        except (aiohttp.ClientError, TimeoutError):
            body = b""
        finally:
            response.close()
        return UpstreamStatusError(
            f"replica {replica_id} answered {response.status}",
            status=response.status,
            body=body,
            content_type=response.headers.get("content-type"),
            replica_id=replica_id,
            retry_after_s=_retry_after_s(response),
        )


def forwarded_headers(raw_headers: list[tuple[bytes, bytes]], request_id: str) -> dict[str, str]:
    """Headers sent upstream: content-type JSON, the request id, and a short allow-list of client headers."""
    out = {"content-type": "application/json", "x-request-id": request_id}
    for key, value in raw_headers:
        if key in _FORWARDED_HEADERS:
            out[key.decode("latin-1")] = value.decode("latin-1")
    return out
