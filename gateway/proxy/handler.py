"""The proxy endpoint: parse → authenticate → admit → route → upstream (with retries) → relay → account.

Every request ends in exactly one of: a relayed response, a contract error response (before the first
byte), or a terminal SSE error event (after it). Whatever happens — the client leaving, a shutdown,
bugs — the serve path releases what it holds in `finally`, so in-flight counts return to zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any

import aiohttp

from admission.outcomes import AdmissionRefused, RejectReason
from admission.retry_after import draining_retry_after_s
from admission.tenants import AuthenticationFailed, Tenant
from core.clock import Clock
from core.shared_state import RedisBackend
from gateway.api.asgi_io import (
    ClientDisconnected,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_response,
)
from gateway.api.request_parsing import Endpoint, ParsedRequest, parse_request
from gateway.autoscaling import AutoscaleSignals
from gateway.error_mapping import to_response, to_sse_event
from gateway.errors import Draining, GatewayError, InternalError, ModelNotFound, Unauthorized
from gateway.metrics import GatewayMetrics
from gateway.proxy.admission import tenant_directory
from gateway.proxy.exchange import Exchange
from gateway.proxy.idempotency import (
    IdempotencyStore,
    ResponseRecorder,
    StoredResponse,
    body_digest,
    idempotency_scope,
    replay_headers,
)
from gateway.proxy.idempotency_redis import idempotency_store
from gateway.proxy.relay import finish_body
from gateway.proxy.serving import RequestServer
from gateway.settings import Settings, SloSettings
from gateway.upstream.registry import Pool, ReplicaRegistry

logger = logging.getLogger(__name__)

OUTCOME_SUCCESS = "success"
OUTCOME_CLIENT_DISCONNECT = "client_disconnect"
UNKNOWN_MODEL_LABEL = "unknown"
PRIORITY_HEADER = b"x-gateway-priority"


class ProxyHandler:
    """Serves the OpenAI endpoints for one app instance."""

    def __init__(
        self,
        settings: Settings,
        registry: ReplicaRegistry,
        session: aiohttp.ClientSession,
        metrics: GatewayMetrics,
        *,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._metrics = metrics
        self._directory = tenant_directory(settings)
        self._server = RequestServer(settings, registry, session, metrics, clock=clock, rng=rng)
        self._idempotency: IdempotencyStore = idempotency_store(
            self._server.state_backend, clock, settings.idempotency
        )
        self.draining = False
        self._active: dict[asyncio.Task[Any], Exchange] = {}

    @property
    def signals(self) -> AutoscaleSignals:
        """The autoscaling signal of this handler's pools (its traffic share is set from outside)."""
        return self._server.signals

    @property
    def state_backend(self) -> RedisBackend | None:
        """The shared-state backend (Redis), None with memory state."""
        return self._server.state_backend

    def start_drain(self) -> None:
        """Refuse new requests and everything still queued with 503 `draining`."""
        self.draining = True
        retry_after_s = draining_retry_after_s(self._settings.server.readiness_propagation_s)
        self._server.reject_waiting(
            AdmissionRefused(RejectReason.DRAINING, retry_after_s, "the gateway is shutting down")
        )

    def start(self) -> None:
        """Start the background work that belongs to serving (the autoscaling signal)."""
        self._server.signals.start()

    async def aclose(self) -> None:
        await self._server.signals.stop()
        await self._server.aclose()

    async def __call__(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(request_id=header(scope, b"x-request-id") or os.urandom(16).hex(), send=send)
        outcome = OUTCOME_SUCCESS
        task = asyncio.current_task()
        assert task is not None
        self._active[task] = exchange
        try:
            if self.draining:
                raise Draining("the gateway is shutting down")
            tenant = self._tenant(scope)
            exchange.tenant = tenant.name
            raw = await read_body(receive, self._settings.server.max_body_bytes)
            exchange.parsed = parse_request(endpoint, raw)
            exchange.pool = self._registry.pool(exchange.parsed.model)
            if exchange.pool is None:
                raise ModelNotFound(f"the model {exchange.parsed.model!r} does not exist")
            async with DisconnectWatcher(receive) as watcher:
                exchange.watcher = watcher
                await self._serve(exchange, exchange.parsed, exchange.pool, scope, tenant)
            if watcher.disconnected:
                outcome = OUTCOME_CLIENT_DISCONNECT
        except ClientDisconnected:
            outcome = OUTCOME_CLIENT_DISCONNECT
        except asyncio.CancelledError:
            if exchange.abort_error is None:
                raise
            task.uncancel()
            outcome = str(exchange.abort_error.code)
            await self._answer_error(exchange, exchange.abort_error)
        except GatewayError as error:
            outcome = str(error.code)
            await self._answer_error(exchange, error)
        except Exception as exc:
            logger.exception("unhandled error in request %s", exchange.request_id)
            internal = InternalError(f"internal gateway error: {type(exc).__name__}")
            outcome = str(internal.code)
            await self._answer_error(exchange, internal)
        finally:
            del self._active[task]
            self._account(exchange, outcome)

    def abort_all(self, error: GatewayError) -> None:
        """End every request still running with `error` (shutdown after the drain timeout)."""
        for task, exchange in self._active.items():
            exchange.abort_error = error
            task.cancel()

    def _tenant(self, scope: Scope) -> Tenant:
        try:
            return self._directory.resolve(header(scope, b"authorization"))
        except AuthenticationFailed as exc:
            raise Unauthorized(exc.message) from None

    async def _serve(
        self, exchange: Exchange, parsed: ParsedRequest, pool: Pool, scope: Scope, tenant: Tenant
    ) -> None:
        priority = self._directory.resolve_priority(tenant, header(scope, PRIORITY_HEADER))
        idempotency_key = header(scope, b"idempotency-key")
        if not idempotency_key or parsed.stream:
            await self._server.serve(exchange, parsed, pool, scope, tenant=tenant, priority=priority)
            return
        scoped = idempotency_scope(pool.model, header(scope, b"authorization"), idempotency_key)
        stored = await self._idempotency.claim(scoped, body_digest(parsed.raw))
        if stored is not None:
            if exchange.watcher is not None:
                exchange.watcher.disarm()
            await send_response(
                exchange.send, stored.status, replay_headers(stored, exchange.request_id), stored.body
            )
            return
        recorder = ResponseRecorder(exchange.send)
        exchange.send = recorder
        outcome: StoredResponse | None = None
        try:
            await self._server.serve(exchange, parsed, pool, scope, tenant=tenant, priority=priority)
            outcome = recorder.stored()
        finally:
            await self._idempotency.complete(scoped, outcome)

    async def _answer_error(self, exchange: Exchange, error: GatewayError) -> None:
        self._metrics.rejections_total.labels(str(error.code)).inc()
        if isinstance(error, Draining) and error.retry_after_s is None:
            error.retry_after_s = draining_retry_after_s(self._settings.server.readiness_propagation_s)
        if exchange.response_started:
            await finish_body(exchange, to_sse_event(error))
            return
        answer = to_response(error)
        headers = [*answer.headers, ("x-request-id", exchange.request_id)]
        if exchange.decision is not None:
            headers.append(("x-gateway-replica", exchange.decision.replica_id))
        await send_response(exchange.send, answer.status, headers, answer.body)
        self._metrics.rejection_duration_seconds.labels(str(error.code)).observe(exchange.elapsed_s())

    def _account(self, exchange: Exchange, outcome: str) -> None:
        model = exchange.pool.model if exchange.pool is not None else UNKNOWN_MODEL_LABEL
        m = self._metrics
        m.requests_total.labels(model, outcome).inc()
        if exchange.tenant is not None:
            m.tenant_requests_total.labels(exchange.tenant, outcome).inc()
        if exchange.pool is None:
            return
        elapsed_s = exchange.elapsed_s()
        m.request_duration_seconds.labels(model).observe(elapsed_s)
        if outcome != OUTCOME_SUCCESS or exchange.ttft_s is None:
            return
        m.ttft_seconds.labels(model).observe(exchange.ttft_s)
        usage = exchange.usage or {}
        self._account_tokens(exchange.tenant, usage)
        completion_tokens = usage.get("completion_tokens")
        if not isinstance(completion_tokens, int):
            return
        streamed = exchange.parsed is not None and exchange.parsed.stream
        tpot_s = None
        if streamed and completion_tokens > 1:
            tpot_s = (elapsed_s - exchange.ttft_s) / (completion_tokens - 1)
            m.tpot_seconds.labels(model).observe(tpot_s)
        if _met_slo(
            exchange.pool.settings.slo,
            ttft_s=exchange.ttft_s,
            tpot_s=tpot_s,
            e2e_s=elapsed_s,
            completion_tokens=completion_tokens,
            streamed=streamed,
        ):
            m.goodput_requests_total.labels(model).inc()
            m.goodput_tokens_total.labels(model).inc(completion_tokens)

    def _account_tokens(self, tenant: str | None, usage: dict[str, Any]) -> None:
        m = self._metrics
        for direction, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            count = usage.get(key)
            if isinstance(count, int):
                m.tokens_total.labels(direction).inc(count)
                if tenant is not None:
                    m.tenant_tokens_total.labels(tenant, direction).inc(count)


def _met_slo(
    slo: SloSettings,
    *,
    ttft_s: float,
    tpot_s: float | None,
    e2e_s: float,
    completion_tokens: int,
    streamed: bool,
) -> bool:
    """Goodput test. Streams: TTFT ≤ slo.ttft_s and TPOT ≤ slo.tpot_s. A non-streamed response shows
    neither, so it counts when it arrived within the time a stream meeting both would have finished:
    e2e ≤ slo.ttft_s + slo.tpot_s × (completion_tokens − 1)."""
    if streamed:
        ttft_ok = slo.ttft_s is None or ttft_s <= slo.ttft_s
        return ttft_ok and (slo.tpot_s is None or tpot_s is None or tpot_s <= slo.tpot_s)
    if slo.ttft_s is None:
        return True
    return e2e_s <= slo.ttft_s + (slo.tpot_s or 0.0) * max(0, completion_tokens - 1)
