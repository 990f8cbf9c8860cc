"""Serve one parsed request: admission, then attempts until one succeeds or the failure is final.

grant   = admit(tenant, class, estimated tokens)       → a claimed slot (or 401/429/503)
attempt = the grant's slot; on a retryable failure before the first byte: backoff, exclude the
          replica, claim a new slot (routing again), within max_attempts and the retry budget
relay   = stream or whole response to the client
finally = close upstream, release the slot and the tenant's lease, reconcile the token bucket
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace

import aiohttp

from admission.grant import AdmissionRequest
from admission.outcomes import AdmissionRefused
from admission.retry_budget import RetryBudget
from admission.tenants import Tenant
from core.clock import Clock
from core.shared_state import RedisBackend
from gateway.api.asgi_io import Scope, header
from gateway.api.request_parsing import ParsedRequest, rewrite_body
from gateway.autoscaling import AutoscaleSignals
from gateway.errors import NoReplica, UpstreamError, UpstreamProtocolError, from_refusal
from gateway.metrics import GatewayMetrics
from gateway.proxy.admission import Dispatch, PoolDispatcher, build_controllers, slot_credits, tenant_gate
from gateway.proxy.attempts import StaleConnection, UpstreamOpener, forwarded_headers
from gateway.proxy.exchange import Exchange
from gateway.proxy.relay import SSE_CONTENT_TYPE, StreamRelay, relay_full
from gateway.proxy.retry_policy import RetryPolicy, failure_kind
from gateway.proxy.timers import IDLE_HEADER, TTFT_HEADER, RequestTimers, request_timers
from gateway.settings import Settings
from gateway.upstream.registry import Pool, ReplicaRegistry
from router.keys import build_routing_request, session_key_of
from router.types import RoutingRequest


@dataclass(frozen=True, slots=True)
class _Upstream:
    body: bytes
    headers: dict[str, str]
    timers: RequestTimers


class RequestServer:
    """The serve path of the proxy (module docstring); one per app."""

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
        self._registry = registry
        self._metrics = metrics
        self._opener = UpstreamOpener(session, metrics)
        self._gate, self._state_backend = tenant_gate(settings, clock, metrics)
        self._credits = slot_credits(settings, self._state_backend, clock, metrics)
        self._pools = build_controllers(
            settings,
            registry=registry,
            opener=self._opener,
            gate=self._gate,
            clock=clock,
            metrics=metrics,
            credits=self._credits,
        )
        self.signals = AutoscaleSignals(registry, metrics, clock, self.queue_depth)
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

    @property
    def state_backend(self) -> RedisBackend | None:
        """The shared-state (Redis) backend built by `tenant_gate`, None with memory state."""
        return self._state_backend

    def queue_depth(self, model: str) -> int:
        """Requests of `model`'s pool waiting for a replica slot."""
        return sum(self._pools[model][1].depths().values())

    def reject_waiting(self, error: AdmissionRefused) -> None:
        """Refuse everything still queued (shutdown)."""
        for _, controller in self._pools.values():
            controller.reject_waiting(error.reason, error.retry_after_s, error.message)

    async def aclose(self) -> None:
        if self._credits is not None:
            await self._credits.aclose()
        if self._state_backend is not None:
            await self._state_backend.aclose()

    async def serve(
        self,
        exchange: Exchange,
        parsed: ParsedRequest,
        pool: Pool,
        scope: Scope,
        *,
        tenant: Tenant,
        priority: str,
    ) -> None:
        routing = build_routing_request(
            parsed.model,
            parsed.prompt_text,
            pool.key_settings,
            session_key=session_key_of(header(scope, b"x-session-id"), parsed.user),
            estimated_prompt_tokens=parsed.estimated_prompt_tokens,
            max_tokens=parsed.max_tokens,
        )
        upstream = _Upstream(
            body=rewrite_body(parsed, pool.settings.upstream_model),
            headers=forwarded_headers(scope["headers"], exchange.request_id),
            timers=request_timers(
                pool.settings.timeouts,
                header(scope, TTFT_HEADER.encode()),
                header(scope, IDLE_HEADER.encode()),
            ),
        )
        dispatcher, controller = self._pools[pool.model]
        self.signals.arrival(pool.model)
        try:
            grant = await controller.admit(
                AdmissionRequest(tenant, priority, routing.estimated_total_tokens, routing)
            )
        except AdmissionRefused as refused:
            raise from_refusal(refused.reason, refused.message, refused.retry_after_s) from None
        exchange.queue_wait_s = grant.queue_wait_s
        self.signals.dispatched(pool.model, grant.queue_wait_s)
        try:
            await self._attempts(exchange, pool, dispatcher, routing, upstream, first=grant.token)
            completion = (exchange.usage or {}).get("completion_tokens")
            if isinstance(completion, int):
                self.signals.completed(
                    pool.model,
                    output_tokens=completion,
                    e2e_s=exchange.elapsed_s(),
                    ttft_s=exchange.ttft_s,
                    queue_wait_s=grant.queue_wait_s,
                )
        finally:
            exchange.release()
            await grant.release()
            actual = _actual_tokens(exchange)
            if actual is not None:
                await grant.reconcile(actual)

    async def _attempts(
        self,
        exchange: Exchange,
        pool: Pool,
        dispatcher: PoolDispatcher,
        routing: RoutingRequest,
        upstream: _Upstream,
        *,
        first: Dispatch,
    ) -> None:
        """The retry loop (see `gateway.proxy.retry_policy` for when a failure is retried)."""
        retry = self._retry_policies[pool.model]
        retry.budget.record_request()
        excluded: set[str] = set()
        last_error: UpstreamError | None = None
        stale_retry_left = True
        claim: Dispatch | None = first
        while True:
            if claim is None:
                claim = self._reclaim(
                    pool,
                    dispatcher=dispatcher,
                    routing=routing,
                    excluded=excluded,
                    last_error=last_error,
                    retry=retry,
                )
            exchange.decision = claim.decision
            exchange.swap_guard(claim.guard)
            replica = claim.guard.replica
            claim = None
            try:
                await self._opener.attempt(
                    exchange, replica, body=upstream.body, headers=upstream.headers, timers=upstream.timers
                )
                self._registry.record_success(replica)
                await self._relay(exchange, upstream.timers)
                return
            except StaleConnection:
                if stale_retry_left:
                    stale_retry_left = False
                    self._metrics.retries_total.labels("stale_connection").inc()
                    continue
                failure: UpstreamError = UpstreamProtocolError(
                    f"replica {replica.replica_id} closed the connection before answering",
                    replica_id=replica.replica_id,
                )
            except UpstreamError as error:
                failure = error
            kind = failure_kind(failure)
            if kind is not None:
                self._registry.record_failure(replica, kind, failure.retry_after_s)
            if exchange.response_started or not retry.eligible(failure, exchange.attempts, routing):
                raise failure
            last_error = failure
            excluded.add(replica.replica_id)
            exchange.release()
            await asyncio.sleep(retry.backoff_s(len(excluded)))

    def _reclaim(
        self,
        pool: Pool,
        *,
        dispatcher: PoolDispatcher,
        routing: RoutingRequest,
        excluded: set[str],
        last_error: UpstreamError | None,
        retry: RetryPolicy,
    ) -> Dispatch:
        """A slot for the next attempt, or the final error (nothing eligible, or no budget left)."""
        claim = dispatcher.claim(replace(routing, exclude=frozenset(excluded)))
        if claim is None:
            raise last_error or NoReplica(
                f"no eligible replica for model {pool.model!r} (all down, draining or circuit-open)",
                retry_after_s=pool.retry_after_s(),
            )
        if last_error is not None:
            if not retry.spend(last_error):
                claim.release()
                raise last_error
            self._metrics.retries_total.labels(str(failure_kind(last_error))).inc()
        return claim

    async def _relay(self, exchange: Exchange, timers: RequestTimers) -> None:
        assert exchange.response is not None and exchange.parsed is not None
        is_sse = exchange.response.headers.get("content-type", "").startswith(SSE_CONTENT_TYPE)
        if exchange.parsed.stream and is_sse:
            await StreamRelay(exchange, timers.ttft_s, timers.total_s).run()
        else:
            await relay_full(exchange, timers.nonstream_s)


def _actual_tokens(exchange: Exchange) -> int | None:
    usage = exchange.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt + completion
    return None
