"""Admission control for the proxy: who may send, in which class, and when a replica slot is free.

Per request: the tenant is resolved from `Authorization` (401 when tenants are configured and the key
is unknown), the priority class from `x-gateway-priority` clamped to the tenant's ceiling, then the
pool's `AdmissionController` applies the tenant's rate limits and bulkhead and either dispatches at once
(a replica under its cap is eligible) or queues the request by class (FIFO within a class, weighted
fair share across tenants) until a slot frees up, its class's max wait passes (429 `queue_timeout`),
or a higher class displaces it (429 `queue_full`). Routing runs at dispatch time, so a queued request
goes where it is cheapest when it leaves the queue.

`PoolDispatcher.claim` is the one synchronous "route and take a slot" step; admission's `try_dispatch`
and the retry loop both use it. State lives in memory or, with `state.backend: redis`, in Redis:
rate limits and tenant concurrency shared by every gateway instance, and the per-replica cap held
across instances through slot credits (`gateway.upstream.slot_credits`): a replica is routable only
while this instance holds a free credit on it; the credits' refiller wakes the controllers when
credits arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from admission.controller import AdmissionConfig, AdmissionController
from admission.grant import AdmissionRequest
from admission.leases import LeaseScope
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_queue import PriorityClass
from admission.redis_leases import RedisLeaseStore
from admission.redis_rate_limit import RedisRateLimitStore
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant, TenantDirectory
from core.clock import Clock
from core.shared_state import FailureMode, RedisBackend, RedisOperation
from gateway.metrics import GatewayMetrics
from gateway.proxy.attempts import UpstreamOpener
from gateway.settings import AdmissionSettings, Settings
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import InflightGuard
from gateway.upstream.slot_credits import SlotCredits
from router.types import Decision, RoutingRequest


@dataclass(slots=True)
class Dispatch:
    """A routing decision with its claimed replica slot (admission's dispatch token)."""

    decision: Decision
    guard: InflightGuard

    def release(self) -> None:
        self.guard.release()


class PoolDispatcher:
    """Route and claim a slot on one pool, synchronously."""

    def __init__(
        self,
        pool: Pool,
        registry: ReplicaRegistry,
        opener: UpstreamOpener,
        credits: SlotCredits | None = None,
        max_inflight: int | None = None,
    ) -> None:
        self._pool = pool
        self._registry = registry
        self._opener = opener
        self._credits = credits
        self._max_inflight = max_inflight

    def full_by_own_caps(self) -> bool:
        """False while the process's upstream connection limit, which every pool shares, is what
        stops a claim: other pools' releases free slots then, which this pool's own grants cannot
        forecast (admission's early refusal stays out)."""
        return self._max_inflight is None or self._registry.total_inflight() < self._max_inflight

    def claim(self, routing: RoutingRequest) -> Dispatch | None:
        """A slot on the replica routing picks among eligible replicas under their cap (with shared
        state: under this instance's credits), or None.

        The process's upstream connection limit (`upstream.max_connections`) is a cap too: at the limit
        nothing is claimed and requests wait in admission like any capped request. Left to the HTTP
        client's own pool, they would wait inside it and its timeouts would be blamed on the replicas
        (connect failures trip breakers), turning a gateway-local limit into a fleet outage."""
        if self._max_inflight is not None and self._registry.total_inflight() >= self._max_inflight:
            return None
        if self._credits is not None:
            self._credits.sync(self._pool)
        decision = self._opener.decide(self._pool, routing)
        if decision is None:
            if self._credits is not None:
                self._credits.wake()  # the refiller looks for credits while requests wait
            return None
        replica = self._pool.replicas[decision.replica_id]
        dispatch = Dispatch(decision, self._registry.acquire(replica, routing.estimated_total_tokens))
        if self._credits is not None:
            self._credits.on_dispatch(replica)
        return dispatch

    def try_dispatch(self, request: AdmissionRequest) -> Dispatch | None:
        """Admission's hook: a slot now, None to wait, `no_replica` when nothing is up at all."""
        assert request.routing is not None
        dispatch = self.claim(request.routing)
        if dispatch is None and not self._pool.has_eligible_replica():
            raise AdmissionRefused(
                RejectReason.NO_REPLICA,
                self._pool.retry_after_s(),
                f"no eligible replica for model {self._pool.model!r} (all down, draining or circuit-open)",
            )
        return dispatch


class MetricsObserver:
    """Admission events → Prometheus."""

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self._metrics = metrics
        self._model = model

    def queue_depth_changed(self, priority: str, depth: int) -> None:
        self._metrics.queue_depth.labels(self._model, priority).set(depth)

    def dispatched(self, priority: str, queue_wait_s: float) -> None:
        self._metrics.queue_wait_seconds.labels(priority).observe(queue_wait_s)

    def rejected(self, reason: RejectReason, priority: str) -> None:
        """Counted by the handler with every other rejection (`rejections_total`)."""


def tenant_directory(settings: Settings) -> TenantDirectory:
    tenants = [
        Tenant(
            name=t.name,
            api_key_hashes=tuple(t.api_key_hashes),
            requests_per_min=t.requests_per_min,
            tokens_per_min=t.tokens_per_min,
            max_concurrent=t.max_concurrent,
            priority_ceiling=t.priority_ceiling,
            weight=t.weight,
        )
        for t in settings.tenants
    ]
    admission = settings.admission
    return TenantDirectory(
        tenants,
        allow_anonymous=admission.allow_anonymous,
        class_names=list(admission.classes),
        default_priority=admission.default_priority,
    )


def admission_config(settings: AdmissionSettings) -> AdmissionConfig:
    classes = tuple(PriorityClass(name, c.max_wait_s, c.max_depth) for name, c in settings.classes.items())
    return AdmissionConfig(
        classes=classes,
        max_queue_depth=settings.max_queue_depth,
        early_refusal_ratio=settings.early_refusal_ratio,
    )


def tenant_gate(
    settings: Settings, clock: Clock, metrics: GatewayMetrics
) -> tuple[TenantGate, RedisBackend | None]:
    """Memory stores, or Redis ones behind atomic scripts with the configured failure mode."""
    state = settings.state
    if state.backend == "memory":
        return TenantGate.in_memory(clock), None

    def count_error(operation: RedisOperation) -> None:
        metrics.state_errors_total.labels(str(operation)).inc()

    backend = RedisBackend.from_url(
        state.url,
        on_error=FailureMode(state.on_error),
        key_prefix=state.key_prefix,
        on_error_callback=count_error,
    )
    gate = TenantGate(RedisRateLimitStore(backend), RedisLeaseStore(backend, LeaseScope.TENANT), clock)
    return gate, backend


def slot_credits(
    settings: Settings, backend: RedisBackend | None, clock: Clock, metrics: GatewayMetrics
) -> SlotCredits | None:
    """Replica slot credits on Redis (None with memory state: each instance's own cap is the cap).
    A failure of the refiller loop itself is logged with its stack trace and counted as
    `llm_gateway_state_errors_total{operation="slot_credit_refill"}`."""
    if backend is None:
        return None
    state = settings.state
    return SlotCredits(
        RedisLeaseStore(backend, LeaseScope.REPLICA),
        backend,
        clock,
        ttl_s=state.replica_lease_ttl_s,
        linger_s=state.replica_credit_linger_s,
        on_error=metrics.state_errors_total.labels("slot_credit_refill").inc,
    )


def build_controllers(
    settings: Settings,
    *,
    registry: ReplicaRegistry,
    opener: UpstreamOpener,
    gate: TenantGate,
    clock: Clock,
    metrics: GatewayMetrics,
    credits: SlotCredits | None = None,
) -> dict[str, tuple[PoolDispatcher, AdmissionController[Dispatch]]]:
    """One dispatcher and controller per pool; every slot release wakes the controllers (and the
    credits' refiller); a credit that arrives wakes its pool's controller."""
    # With shared slot credits, a queued request is what makes this instance ask Redis for more: an
    # arrival that would be first in line always queues (see AdmissionConfig).
    config = replace(admission_config(settings.admission), early_refusal_needs_queue=credits is not None)
    built: dict[str, tuple[PoolDispatcher, AdmissionController[Dispatch]]] = {}
    if credits is not None:
        registry.add_release_listener(credits.wake)
    for pool in registry.pools.values():
        dispatcher = PoolDispatcher(pool, registry, opener, credits, settings.upstream.max_connections)
        controller: AdmissionController[Dispatch] = AdmissionController(
            dispatcher.try_dispatch,
            gate,
            clock=clock,
            config=config,
            observer=MetricsObserver(metrics, pool.model),
            full_by_own_caps=dispatcher.full_by_own_caps,
        )
        registry.add_release_listener(controller.on_release)
        if credits is not None:
            credits.attach(pool, waiting=controller.__len__, on_credit=controller.on_release)
        built[pool.model] = (dispatcher, controller)
    return built
