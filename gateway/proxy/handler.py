"""The proxy endpoint: parse → route → open upstream (with retries) → relay → account, for every outcome.

Every request ends in exactly one of: a relayed response, a contract error response (before the first
byte), or a terminal SSE error event (after it). Whatever happens — including the client leaving and
bugs — `Exchange.release()` runs in `finally`, so in-flight counts return to zero.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from dataclasses import replace
from typing import Any

import aiohttp

from admission.clock import Clock
from admission.retry_after import draining_retry_after_s
from admission.retry_budget import RetryBudget
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
from gateway.api.request_parsing import Endpoint, ParsedRequest, parse_request, rewrite_body
from gateway.error_mapping import to_response, to_sse_event
from gateway.errors import (
    Draining,
    GatewayError,
    InternalError,
    ModelNotFound,
    NoReplica,
    UpstreamConnectError,
    UpstreamError,
)
from gateway.metrics import GatewayMetrics
from gateway.proxy.attempts import StaleConnection, UpstreamOpener, forwarded_headers
from gateway.proxy.exchange import Exchange
from gateway.proxy.idempotency import (
    IdempotencyCache,
    ResponseRecorder,
    StoredResponse,
    body_digest,
    idempotency_scope,
    replay_headers,
)
from gateway.proxy.relay import SSE_CONTENT_TYPE, StreamRelay, finish_body, relay_full
from gateway.proxy.retry_policy import RetryPolicy, failure_kind
from gateway.proxy.timers import IDLE_HEADER, TTFT_HEADER, RequestTimers, request_timers
from gateway.settings import Settings
from gateway.upstream.registry import Pool, ReplicaRegistry
from router.keys import build_routing_request, session_key_of
from router.types import RoutingRequest

logger = logging.getLogger(__name__)

OUTCOME_SUCCESS = "success"
OUTCOME_CLIENT_DISCONNECT = "client_disconnect"
UNKNOWN_MODEL_LABEL = "unknown"


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
        self._opener = UpstreamOpener(session, registry, metrics)
        self._retry_policies = {
            pool.model: RetryPolicy(
                pool.settings.retries,
                RetryBudget(
                    clock,
                    budget_ratio=pool.settings.retries.budget_ratio,
                    min_retries_per_s=pool.settings.retries.budget_min_per_s,
                ),
                random.Random(rng.random()),
            )
            for pool in registry.pools.values()
        }
        self._idempotency = IdempotencyCache(clock)
        self.draining = False
        self._active: dict[asyncio.Task[Any], Exchange] = {}

    async def __call__(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(request_id=header(scope, b"x-request-id") or uuid.uuid4().hex, send=send)
        outcome = OUTCOME_SUCCESS
        task = asyncio.current_task()
        assert task is not None
        self._active[task] = exchange
        try:
            if self.draining:
                raise Draining("the gateway is shutting down")
            raw = await read_body(receive, self._settings.server.max_body_bytes)
            exchange.parsed = parse_request(endpoint, raw)
            exchange.pool = self._registry.pool(exchange.parsed.model)
            if exchange.pool is None:
                raise ModelNotFound(f"the model {exchange.parsed.model!r} does not exist")
            async with DisconnectWatcher(receive) as watcher:
                exchange.watcher = watcher
                idempotency_key = header(scope, b"idempotency-key")
                if idempotency_key and not exchange.parsed.stream:
                    await self._serve_idempotent(
                        exchange, exchange.parsed, exchange.pool, scope, idempotency_key
                    )
                else:
                    await self._serve(exchange, exchange.parsed, exchange.pool, scope)
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

    async def _serve_idempotent(
        self, exchange: Exchange, parsed: ParsedRequest, pool: Pool, scope: Scope, key: str
    ) -> None:
        """Serve once per key (see `gateway.proxy.idempotency`)."""
        scoped = idempotency_scope(pool.model, header(scope, b"authorization"), key)
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
            await self._serve(exchange, parsed, pool, scope)
            outcome = recorder.stored()
        finally:
            self._idempotency.complete(scoped, outcome)

    async def _serve(self, exchange: Exchange, parsed: ParsedRequest, pool: Pool, scope: Scope) -> None:
        routing = build_routing_request(
            parsed.model,
            parsed.prompt_text,
            pool.key_settings,
            session_key=session_key_of(header(scope, b"x-session-id"), parsed.user),
            estimated_prompt_tokens=parsed.estimated_prompt_tokens,
            max_tokens=parsed.max_tokens,
        )
        timers = request_timers(
            pool.settings.timeouts, header(scope, TTFT_HEADER.encode()), header(scope, IDLE_HEADER.encode())
        )
        body = rewrite_body(parsed, pool.settings.upstream_model)
        headers = forwarded_headers(scope["headers"], exchange.request_id)
        try:
            await self._attempt_until_done(
                exchange, pool=pool, routing=routing, body=body, headers=headers, timers=timers
            )
        finally:
            await exchange.release()

    async def _attempt_until_done(
        self,
        exchange: Exchange,
        *,
        pool: Pool,
        routing: RoutingRequest,
        body: bytes,
        headers: dict[str, str],
        timers: RequestTimers,
    ) -> None:
        """The retry loop (see `gateway.proxy.retry_policy` for when a failure is retried)."""
        retry = self._retry_policies[pool.model]
        retry.budget.record_request()
        excluded: set[str] = set()
        last_error: UpstreamError | None = None
        stale_retry_left = True
        while True:
            decision = self._opener.decide(pool, replace(routing, exclude=frozenset(excluded)))
            if decision is None:
                raise last_error or NoReplica(
                    f"no eligible replica for model {pool.model!r} (all down, draining or circuit-open)",
                    retry_after_s=pool.retry_after_s(),
                )
            if last_error is not None:
                if not retry.spend():
                    raise last_error
                self._metrics.retries_total.labels(str(failure_kind(last_error))).inc()
            exchange.decision = decision
            replica = pool.replicas[decision.replica_id]
            try:
                await self._opener.attempt(
                    exchange,
                    replica,
                    tokens=routing.estimated_total_tokens,
                    body=body,
                    headers=headers,
                    timers=timers,
                )
                self._registry.record_success(replica)
                await self._relay(exchange, timers)
                return
            except StaleConnection:
                if not stale_retry_left:
                    raise UpstreamConnectError(
                        f"replica {replica.replica_id} closed the connection twice",
                        replica_id=replica.replica_id,
                    ) from None
                stale_retry_left = False
                self._metrics.retries_total.labels("stale_connection").inc()
            except UpstreamError as error:
                kind = failure_kind(error)
                if kind is not None:
                    self._registry.record_failure(replica, kind, error.retry_after_s)
                if exchange.response_started or not retry.eligible(error, exchange.attempts, routing):
                    raise
                last_error = error
                excluded.add(replica.replica_id)
                await exchange.release()
                await asyncio.sleep(retry.backoff_s(len(excluded)))

    async def _relay(self, exchange: Exchange, timers: RequestTimers) -> None:
        assert exchange.response is not None and exchange.parsed is not None
        is_sse = exchange.response.headers.get("content-type", "").startswith(SSE_CONTENT_TYPE)
        if exchange.parsed.stream and is_sse:
            await StreamRelay(exchange, timers.ttft_s, timers.total_s).run()
        else:
            await relay_full(exchange, timers.nonstream_s)

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

    def _account(self, exchange: Exchange, outcome: str) -> None:
        model = exchange.pool.model if exchange.pool is not None else UNKNOWN_MODEL_LABEL
        m = self._metrics
        m.requests_total.labels(model, outcome).inc()
        if exchange.pool is None:
            return
        elapsed_s = exchange.elapsed_s()
        m.request_duration_seconds.labels(model).observe(elapsed_s)
        if outcome != OUTCOME_SUCCESS or exchange.ttft_s is None:
            return
        m.ttft_seconds.labels(model).observe(exchange.ttft_s)
        usage = exchange.usage or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if isinstance(prompt_tokens, int):
            m.tokens_total.labels("input").inc(prompt_tokens)
        if isinstance(completion_tokens, int):
            m.tokens_total.labels("output").inc(completion_tokens)
            if completion_tokens > 1 and exchange.parsed is not None and exchange.parsed.stream:
                m.tpot_seconds.labels(model).observe((elapsed_s - exchange.ttft_s) / (completion_tokens - 1))
