"""Route and open the upstream response, retrying only before the first byte.

Each attempt makes a fresh routing decision with the replicas that already failed this request
excluded. Retried: connect failures (the replica is marked down, see the registry), and a request that
failed on a reused keep-alive connection before any byte came back (retried once, not held against the
replica: engines close idle connections). Not retried: anything after response headers arrived.
An upstream error status is raised as `UpstreamStatusError` with the engine's status and body.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx

from gateway.errors import (
    NoReplica,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTTFTTimeout,
)
from gateway.metrics import GatewayMetrics
from gateway.proxy.exchange import Exchange
from gateway.upstream.registry import Pool, ReplicaRegistry
from router.types import Decision, RoutingRequest

MAX_ERROR_BODY_BYTES = 64 * 1024
NO_REPLICA_RETRY_FLOOR_S = 1.0
_FORWARDED_HEADERS = (b"authorization", b"accept", b"user-agent")


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class UpstreamOpener:
    """Runs the attempt loop for one exchange; leaves `exchange.response` open on success."""

    def __init__(self, client: httpx.AsyncClient, registry: ReplicaRegistry, metrics: GatewayMetrics) -> None:
        self._client = client
        self._registry = registry
        self._metrics = metrics

    def decide(self, pool: Pool, routing: RoutingRequest) -> Decision | None:
        started = asyncio.get_running_loop().time()
        decision = pool.policy.decide(routing, pool.snapshot())
        self._metrics.routing_decision_seconds.observe(asyncio.get_running_loop().time() - started)
        if decision is not None:
            self._metrics.routing_decisions_total.labels(decision.policy, decision.branch).inc()
        return decision

    async def open(
        self,
        exchange: Exchange,
        pool: Pool,
        routing: RoutingRequest,
        body: bytes,
        headers: list[tuple[str, str]],
    ) -> None:
        """Open the upstream response into `exchange.response`, or raise the contract error."""
        max_attempts = pool.settings.retries.max_attempts
        excluded: set[str] = set()
        last_error: UpstreamError | None = None
        counted_attempts = 0
        stale_retry_left = True
        retry_reason: str | None = None
        while counted_attempts < max_attempts:
            decision = self.decide(pool, _exclude(routing, excluded))
            if decision is None:
                break
            if retry_reason is not None:
                self._metrics.retries_total.labels(retry_reason).inc()
            replica = pool.replicas[decision.replica_id]
            exchange.decision = decision
            exchange.swap_guard(self._registry.acquire(replica, routing.estimated_total_tokens))
            exchange.attempts += 1
            try:
                response = await self._send(pool, replica.url, exchange, body, headers)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                counted_attempts += 1
                retry_reason = "connect"
                self._registry.record_connect_failure(replica)
                excluded.add(replica.replica_id)
                last_error = UpstreamConnectError(
                    f"could not connect to replica {replica.replica_id}", replica_id=replica.replica_id
                )
                continue
            except httpx.RemoteProtocolError:
                if not stale_retry_left:
                    raise UpstreamConnectError(
                        f"replica {replica.replica_id} closed the connection", replica_id=replica.replica_id
                    ) from None
                stale_retry_left = False
                retry_reason = "stale_connection"
                continue
            self._registry.record_success(replica)
            if response.status_code >= 400:
                raise await self._status_error(response, replica.replica_id)
            exchange.response = response
            return
        raise last_error or self._no_replica(pool)

    async def _send(
        self, pool: Pool, url: str, exchange: Exchange, body: bytes, headers: list[tuple[str, str]]
    ) -> httpx.Response:
        timeouts = pool.settings.timeouts
        assert exchange.parsed is not None
        streaming = exchange.parsed.stream
        read_s = timeouts.idle_s if streaming else timeouts.nonstream_s
        request = self._client.build_request(
            "POST",
            url + exchange.parsed.endpoint.value,
            content=body,
            headers=headers,
            timeout=httpx.Timeout(
                connect=timeouts.connect_s, read=read_s, write=timeouts.idle_s, pool=timeouts.connect_s
            ),
        )
        if not streaming:
            return await self._client.send(request, stream=True)
        try:
            async with asyncio.timeout(timeouts.ttft_s):
                return await self._client.send(request, stream=True)
        except TimeoutError:
            raise UpstreamTTFTTimeout(
                f"no response from the replica within the first-token deadline of {timeouts.ttft_s} s",
                replica_id=exchange.decision.replica_id if exchange.decision else None,
            ) from None

    async def _status_error(self, response: httpx.Response, replica_id: str) -> UpstreamStatusError:
        try:
            body = b""
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) >= MAX_ERROR_BODY_BYTES:
                    break
        except httpx.HTTPError:
            pass
        finally:
            await response.aclose()
        return UpstreamStatusError(
            f"replica {replica_id} answered {response.status_code}",
            status=response.status_code,
            body=body[:MAX_ERROR_BODY_BYTES],
            content_type=response.headers.get("content-type"),
            replica_id=replica_id,
            retry_after_s=_retry_after_s(response),
        )

    @staticmethod
    def _no_replica(pool: Pool) -> NoReplica:
        recovery_s = pool.seconds_until_recovery()
        return NoReplica(
            f"no eligible replica for model {pool.model!r} (all down, draining or circuit-open)",
            retry_after_s=max(NO_REPLICA_RETRY_FLOOR_S, recovery_s or NO_REPLICA_RETRY_FLOOR_S),
        )


def _exclude(routing: RoutingRequest, excluded: set[str]) -> RoutingRequest:
    if not excluded:
        return routing
    return replace(routing, exclude=routing.exclude | frozenset(excluded))


def forwarded_headers(raw_headers: list[tuple[bytes, bytes]], request_id: str) -> list[tuple[str, str]]:
    """Headers sent upstream: content-type JSON, the request id, and a short allow-list of client headers."""
    out = [("content-type", "application/json"), ("x-request-id", request_id)]
    for key, value in raw_headers:
        if key in _FORWARDED_HEADERS:
            out.append((key.decode("latin-1"), value.decode("latin-1")))
    return out
