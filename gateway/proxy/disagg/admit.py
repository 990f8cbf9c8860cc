"""Admission for a disaggregated pool: one queue, two slots — a prefill replica and a decode replica.

A request of a disaggregated pool is dispatched when BOTH sets have a replica under its cap: routing
decides on the prefill set (its policy, e.g. prefix cache) and on the decode set (e.g. least load),
nothing claimed or recorded, and only when both chose does it claim both (`PoolAdmission.decide` /
`take`), so a full decode set never churns prefill slots (claim, fail, release, wake the queue, again)
and the prefill set's prefix index records a request only once it is sent (`router.profile`: a
request waiting for decode room would otherwise find its own unsent prefill there, read as cached).
The two slots travel as one `SlotSet` to the ticket, which holds them by role from the start
(`SlotRole.PREFILL`, `DECODE`); each is released on its own when its leg is done, the ticket releases
what is left. `no_replica` (503) when either set has no eligible replica at
all. Queue classes, waits and early refusal are the pool's, as for an aggregated pool
(`build_admission`).

With Redis slot credits (`gateway.upstream.slot_credits`) the pair queue is demand on both sets: its
waiters make the refiller ask for credits on either set as the sets' own (empty) queues would, and a
credit's arrival wakes it. Where credits govern either set (a configured cap), an arrival that would be
first in line queues rather than being refused early, as in an aggregated pool
(`admission_assembly.credits_govern`): a queued request is what asks Redis for more.

The process's upstream connection limit (`upstream.max_connections`) counts a pair as two: a pair is
claimed only while both of its requests fit under it, and only then is the pool full by its own caps
(early refusal forecasts from its own tickets), as `PoolAdmission.connections_free` says of one.
"""

from __future__ import annotations

from dataclasses import replace

from admission.config import AdmissionConfig
from admission.controller import AdmissionController
from admission.outcomes import AdmissionRefused, RejectReason
from admission.slo_wait import slo_bounded_classes
from admission.tenant_gate import TenantGate
from admission.ticket import AdmissionRequest, SlotRole, SlotSet, Ticket
from core.clock import Clock
from gateway.base.errors import from_refusal
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import Settings
from gateway.proxy.admission_assembly import Admission, admission_config, credits_govern
from gateway.proxy.admission_metrics import MetricsObserver
from gateway.proxy.admit import PoolAdmission
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.slot import Slot
from gateway.upstream.slot_credits import SlotCredits
from router.types import RoutingRequest

PAIR_CONNECTIONS = 2
"""Upstream requests one pair holds at once: its prefill and its decode slot."""


class PairAdmission:
    """One disaggregated pool's admission (module docstring)."""

    def __init__(
        self,
        decode: PoolAdmission,
        prefill: PoolAdmission,
        gate: TenantGate,
        *,
        clock: Clock,
        config: AdmissionConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self.decode = decode
        self.prefill = prefill
        self.model = decode.pool.model
        self.controller: AdmissionController[Slot] = AdmissionController(
            self.try_dispatch,
            gate,
            clock=clock,
            config=config,
            observer=MetricsObserver(metrics, self.model),
            full_by_own_caps=self.pair_fits,
        )

    async def admit(self, request: AdmissionRequest) -> Ticket[Slot]:
        """A ticket holding the PREFILL and DECODE slots, or the refusal as the gateway error answering
        it."""
        try:
            return await self.controller.admit(request)
        except AdmissionRefused as refused:
            raise from_refusal(refused) from None

    def queue_depth(self) -> int:
        return len(self.controller)

    def pair_fits(self) -> bool:
        """A pair's two requests fit under the process's connection limit; admission's
        `full_by_own_caps` (module docstring)."""
        return self.decode.connections_free(PAIR_CONNECTIONS)

    def claim_pair(self, routing: RoutingRequest) -> SlotSet[Slot] | None:
        """Both slots, or none (module docstring)."""
        if not self.pair_fits():
            return None
        prefill = self.prefill.decide(routing)
        if prefill is None:
            return None
        decode = self.decode.decide(routing)
        if decode is None:
            return None
        return SlotSet(
            {
                SlotRole.PREFILL: self.prefill.take(prefill, routing),
                SlotRole.DECODE: self.decode.take(decode, routing),
            }
        )

    def try_dispatch(self, request: AdmissionRequest) -> SlotSet[Slot] | None:
        """Admission's hook: the pair now, None to wait, `no_replica` when a set has nothing up."""
        assert request.routing is not None
        pair = self.claim_pair(request.routing)
        if pair is None:
            for side in (self.prefill, self.decode):
                if not side.pool.has_eligible_replica():
                    raise self.no_replica(side)
        return pair

    def no_replica(self, side: PoolAdmission) -> AdmissionRefused:
        """`no_replica` (503) naming the set with nothing eligible, with its soonest Retry-After."""
        role = "prefill" if side is self.prefill else "decode"
        return AdmissionRefused(
            RejectReason.NO_REPLICA,
            side.pool.retry_after_s(),
            f"no eligible {role} replica for model {self.model!r} (all down, draining or circuit-open)",
        )


def add_pair_admissions(
    admission: Admission,
    settings: Settings,
    *,
    registry: ReplicaRegistry,
    gate: TenantGate,
    clock: Clock,
    metrics: GatewayMetrics,
    credits: SlotCredits | None = None,
) -> None:
    """A `PairAdmission` for every disaggregated pool, over the `PoolAdmission`s of its two sets, woken
    by every slot release like the others; with `credits`, its queue is demand on both sets (module
    docstring)."""
    config = admission_config(settings.admission)
    for pool in registry.pools.values():
        if pool.prefill is None:
            continue
        slo = pool.settings.slo
        classes = slo_bounded_classes(config.classes, slo.ttft_s, slo.queue_wait_ratio, slo.bound_classes)
        sets = (pool, pool.prefill)
        needs_queue = any(credits_govern(side.settings, credits) for side in sets)
        pair = PairAdmission(
            admission.pool(pool.model),
            admission.pool(pool.prefill.model),
            gate,
            clock=clock,
            config=replace(config, classes=classes, early_refusal_needs_queue=needs_queue),
            metrics=metrics,
        )
        registry.add_release_listener(pair.controller.on_release)
        if credits is not None:
            for side in sets:
                credits.add_demand(side.model, waiting=pair.queue_depth, on_credit=pair.controller.on_release)
        admission.add_pair(pool.model, pair)
