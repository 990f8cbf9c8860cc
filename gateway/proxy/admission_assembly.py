"""Every pool's admission by client-facing model name (`Admission`), and its assembly from settings.

`build_admission` makes one `PoolAdmission` (`gateway.proxy.admit`) per configured pool, each with its
classes' waits bounded by the pool's TTFT objective, and wires slot releases, capacity changes and
arriving slot credits to the pools' pumps; `tenant_directory` and `admission_config` turn the
`tenants:` and `admission:` settings into the admission package's own types. Kept apart from
`PoolAdmission` because this is start-time wiring, read once by the composition root, while a pool's
admission is on every request's path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from admission.config import AdmissionConfig
from admission.outcomes import AdmissionRefused
from admission.priority_classes import PriorityClass
from admission.slo_wait import slo_bounded_classes
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant, TenantDirectory
from core.clock import Clock
from gateway.base.metrics import GatewayMetrics
from gateway.config.admission_settings import AdmissionSettings
from gateway.config.pool_settings import PoolSettings
from gateway.config.settings import Settings
from gateway.proxy.admit import PoolAdmission
from gateway.proxy.route import Router
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.slot_credits import SlotCredits

if TYPE_CHECKING:
    from gateway.proxy.disagg.admit import PairAdmission


class Admission:
    """Every pool's admission, by client-facing model name; a disaggregated pool's requests are admitted
    by its pair admission (`add_pair`), which claims on its two sets through their `PoolAdmission`s."""

    def __init__(self, pools: dict[str, PoolAdmission]) -> None:
        self._pools = pools
        self._pairs: dict[str, PairAdmission] = {}

    def add_pair(self, model: str, pair: PairAdmission) -> None:
        self._pairs[model] = pair

    def pair(self, model: str) -> PairAdmission:
        """The pair admission of disaggregated `model`."""
        return self._pairs[model]

    def pool(self, model: str) -> PoolAdmission:
        """The admission of `model`'s pool (a configured model: the handler checked it)."""
        return self._pools[model]

    def queue_depth(self, model: str) -> int:
        """Requests of `model`'s pool waiting for a replica slot."""
        pair = self._pairs.get(model)
        return self._pools[model].queue_depth() if pair is None else pair.queue_depth()

    def reject_waiting(self, refused: AdmissionRefused) -> None:
        """Refuse everything still queued (shutdown)."""
        for pool in self._pools.values():
            pool.reject_waiting(refused)
        for pair in self._pairs.values():
            pair.controller.reject_waiting(refused.reason, refused.retry_after_s, refused.message)


def tenant_directory(settings: Settings) -> TenantDirectory:
    """The configured tenants (API key hashes, limits, ceiling, weight) and the class names."""
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
    """The controllers' configuration from the `admission:` settings."""
    classes = tuple(PriorityClass(name, c.max_wait_s, c.max_depth) for name, c in settings.classes.items())
    return AdmissionConfig(
        classes=classes,
        max_queue_depth=settings.max_queue_depth,
        early_refusal_ratio=settings.early_refusal_ratio,
        lowest_class_reserve=settings.lowest_class_reserve,
        retry_lane_share=settings.retry_lane_share,
        retry_lane_horizon_s=settings.retry_lane_horizon_s,
    )


def build_admission(
    settings: Settings,
    *,
    registry: ReplicaRegistry,
    router: Router,
    gate: TenantGate,
    clock: Clock,
    metrics: GatewayMetrics,
    credits: SlotCredits | None = None,
) -> Admission:
    """One `PoolAdmission` per pool, its classes' waits bounded by the pool's TTFT objective
    (`admission.slo_wait`); every slot release (and capacity change) schedules every pool's pump (and
    wakes the credits' refiller); a credit that arrives schedules its pool's pump."""
    config = admission_config(settings.admission)
    if credits is not None:
        registry.add_release_listener(credits.wake)
    pools: dict[str, PoolAdmission] = {}
    for pool in registry.pools.values():
        slo = pool.settings.slo
        classes = slo_bounded_classes(config.classes, slo.ttft_s, slo.queue_wait_ratio, slo.bound_classes)
        admission = PoolAdmission(
            pool,
            registry,
            router,
            gate,
            clock=clock,
            config=replace(
                config, classes=classes, early_refusal_needs_queue=credits_govern(pool.settings, credits)
            ),
            metrics=metrics,
            credits=credits,
            max_inflight=settings.upstream.max_connections,
        )
        registry.add_release_listener(admission.on_release)
        if credits is not None:
            credits.attach(pool, waiting=admission.queue_depth, on_credit=admission.on_release)
        pools[pool.model] = admission
    return Admission(pools)


def credits_govern(pool: PoolSettings, credits: SlotCredits | None) -> bool:
    """Shared slot credits bound the pool's replicas: Redis state and a configured
    `max_concurrency_per_replica` (credits govern only capped replicas). There a queued request is what
    makes this instance ask Redis for more, so an arrival that would be first in line always queues
    (`AdmissionConfig.early_refusal_needs_queue`); elsewhere early refusal answers it at arrival."""
    return credits is not None and pool.max_concurrency_per_replica is not None
