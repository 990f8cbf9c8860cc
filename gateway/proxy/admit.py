"""Admission for the proxy: who may send, in which class, and when a replica slot is free.

Per request: the tenant is resolved from `Authorization` (401 when tenants are configured and the key
is unknown), the priority class from `x-gateway-priority` clamped to the tenant's ceiling (both in the
handler, with the `TenantDirectory` built here), then the pool's `AdmissionController` applies the
tenant's rate limits and bulkhead and either dispatches at once (a replica under its cap is eligible)
or queues the request by class (FIFO within a class, weighted fair share across tenants) until a slot
frees up, its class's max wait passes (429 `queue_timeout`), or a higher class displaces it (429
`queue_full`). Routing runs at dispatch time, so a queued request goes where it is cheapest when it
leaves the queue; with the pool's `prefix_wait` on, it may instead keep waiting for the replica holding
its prefix while that fits its TTFT objective (`PoolAdmission.prefer_wait`, `router.prefix_wait`).
What admission gives is a `Ticket` (`admission.ticket`) holding the `Slot`. Every pool's admission
by model name, and its assembly from the settings, is `gateway.proxy.admission_assembly`.

`PoolAdmission.claim` is the one synchronous "route and take a slot" step; admission's `try_dispatch`
and the retry loop both use it, and `PoolAdmission.no_replica` is the one `no_replica` refusal. One
snapshot of the pool per dispatch attempt: admission asks `prefer_wait`, then (no hold) `try_dispatch`
for the same request in one synchronous step, so that `try_dispatch` routes on the cap share and views
`prefer_wait` took (nothing changed in between); any other call takes its own. State lives in memory
or, with `state.backend: redis`, in Redis: rate limits and tenant concurrency shared by every gateway
instance, and the per-replica cap held across instances through slot credits
(`gateway.upstream.slot_credits`): a replica is routable only while this instance holds a free credit
on it; the credits' refiller wakes the controllers when credits arrive.
"""

from __future__ import annotations

from dataclasses import replace

from admission.config import AdmissionConfig
from admission.controller import AdmissionController
from admission.holds import Hold, WaitContext
from admission.lowest_class_reserve import cap_share
from admission.outcomes import AdmissionRefused, RejectReason
from admission.tenant_gate import TenantGate
from admission.ticket import AdmissionRequest, Ticket
from core.clock import Clock
from gateway.base.errors import from_refusal
from gateway.base.metrics import GatewayMetrics
from gateway.proxy.admission_metrics import MetricsObserver
from gateway.proxy.ring_owner_claim import claim_for_key, headroom_share, keyed_policy, room_at_deadline
from gateway.proxy.route import Router
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.slot import Slot
from gateway.upstream.slot_credits import SlotCredits
from router.prefix_index import policy_prefix_index
from router.prefix_wait import QueueState, key_owner_wait, owner_wait
from router.types import CapTier, Decision, ReplicaView, RoutingRequest


class PoolAdmission:
    """One pool's admission: its controllers and the route-and-claim step they dispatch with.

    A controller (and so a queue) per model name the pool serves, created on a name's first request:
    the pool's model, and each declared name or LoRA adapter (`gateway.config.model_settings`). An adapter
    may live on a few replicas only, and a controller's pump stops at the first waiter no replica
    takes (it assumes every waiter could use the same slots); one queue per name keeps requests for
    an adapter whose replicas are full from holding up the base model's on the others. The cost: the
    classes and fair share order requests within a name, not across names, and `max_queue_depth`
    holds per name."""

    def __init__(
        self,
        pool: Pool,
        registry: ReplicaRegistry,
        router: Router,
        gate: TenantGate,
        *,
        clock: Clock,
        config: AdmissionConfig,
        metrics: GatewayMetrics,
        credits: SlotCredits | None = None,
        max_inflight: int | None = None,
    ) -> None:
        self.pool = pool
        self._registry = registry
        self._router = router
        self._credits = credits
        self._max_inflight = max_inflight
        self._gate = gate
        self._clock = clock
        self._config = config
        self._metrics = metrics
        self._controllers: dict[str, AdmissionController[Slot]] = {}
        self._class_names = tuple(c.name for c in config.classes)
        self._attempt: tuple[AdmissionRequest, float, tuple[ReplicaView, ...]] | None = None  # prefer_wait's
        self.controller = self.controller_for(pool.model)

    def controller_for(self, model: str) -> AdmissionController[Slot]:
        """The controller (queue) of requests for `model`, one of this pool's names (class docstring)."""
        controller = self._controllers.get(model)
        if controller is None:
            controller = self._controllers[model] = AdmissionController(
                self.try_dispatch,
                self._gate,
                clock=self._clock,
                config=self._config,
                observer=MetricsObserver(self._metrics, model),
                full_by_own_caps=self.connections_free,
                prefer_wait=self.prefer_wait if self.pool.settings.prefix_wait.enabled else None,
                slot_key=_replica_id,
                output_tokens=_output_budget,
                seconds_per_token=self.token_latency_s,
                slots_over_caps=self.slots_over_caps,
                try_at_deadline=self.try_at_deadline if self._deadline_headroom() else None,
            )
        return controller

    def _deadline_headroom(self) -> bool:
        latency = self.pool.settings.latency_model
        return latency.enabled and latency.adaptive_cap and latency.deadline_headroom

    async def admit(self, request: AdmissionRequest) -> Ticket[Slot]:
        """A ticket holding a slot, or the refusal as the gateway error that answers it."""
        model = self.pool.model if request.routing is None else request.routing.model
        try:
            return await self.controller_for(model).admit(request)
        except AdmissionRefused as refused:
            raise from_refusal(refused) from None

    def on_release(self) -> None:
        """A slot may have freed up: every name's pump is scheduled."""
        for controller in list(self._controllers.values()):
            controller.on_release()

    def reject_waiting(self, refused: AdmissionRefused) -> None:
        """Refuse every request still queued, of every name."""
        for controller in self._controllers.values():
            controller.reject_waiting(refused.reason, refused.retry_after_s, refused.message)

    def queue_depth(self) -> int:
        """Requests of this pool waiting for a replica slot (every name)."""
        return sum(len(controller) for controller in self._controllers.values())

    def connections_free(self, count: int = 1) -> bool:
        """`count` more upstream requests fit under the process's connection limit (a disaggregated pair
        claims two); admission's `full_by_own_caps`: while this limit, shared by every pool, stops a
        claim, other pools' releases free slots this pool's tickets cannot forecast (no early refusal)."""
        return self._max_inflight is None or self._registry.total_inflight() + count <= self._max_inflight

    def token_latency_s(self) -> float | None:
        """The pool's time per output token now: the mean of its engines' last token-latency windows
        (`ReplicaCost.token_latency_s`); None when no engine reported one."""
        known = [r.cost.token_latency_s for r in self.pool.replicas.values() if r.cost.token_latency_s]
        return sum(known) / len(known) if known else None

    def slots_over_caps(self, request: AdmissionRequest) -> int:
        """Requests this instance runs above its replicas' caps as `request`'s class sees them (its
        `cap_share`; the top class's borrow): releases that free nothing for it (early refusal's blocked)."""
        cap_share = self.cap_share(request)
        borrow = request.routing is not None and request.routing.borrows_lowest_place
        over = 0
        for replica in self.pool.replicas.values():
            cap = replica.effective_max_concurrency(cap_share, borrow)
            if cap is not None and replica.inflight_requests > cap:
                over += replica.inflight_requests - cap
        return over

    def claim(self, routing: RoutingRequest, views: tuple[ReplicaView, ...] | None = None) -> Slot | None:
        """A slot on the replica routing picks among eligible replicas under their cap (with shared
        state: under this instance's credits), or None.

        The process's upstream connection limit (`upstream.max_connections`) is a cap too: at the limit
        nothing is claimed and requests wait in admission like any capped request. Left to the HTTP
        client's own pool, they would wait inside it and its timeouts would be blamed on the replicas
        (connect failures trip breakers), turning a gateway-local limit into a fleet outage. `views`:
        the pool's snapshot for `routing.cap_share` taken in this synchronous step, else one is taken."""
        decision = self.decide(routing, views)
        return None if decision is None else self.take(decision, routing)

    def decide(
        self, routing: RoutingRequest, views: tuple[ReplicaView, ...] | None = None
    ) -> Decision | None:
        """`claim`'s routing half: the replica it would take, nothing claimed (a disaggregated pool
        decides on both of its sets before it claims either: `gateway.proxy.disagg.admit`)."""
        if not self.connections_free():
            return None
        if self._credits is not None and views is None:  # views given: synced when they were taken
            self._credits.sync(self.pool)
        decision = self._router.decide(self.pool, routing, views)
        if decision is None and self._credits is not None:
            self._credits.wake()  # the refiller looks for credits while requests wait
        return decision

    def take(self, decision: Decision, routing: RoutingRequest) -> Slot:
        """`claim`'s claiming half: the slot on the replica `decision` chose; the decision is committed
        here (the policy's prefix index records the request), never for a decision not taken."""
        replica = self.pool.replicas[decision.replica_id]
        self._router.commit(self.pool, routing, decision)
        detail = decision.detail
        uncached = routing.uncached_tokens(detail.get("matched_prefix_blocks"))
        shared, common = detail.get("shared_prefix_blocks"), detail.get("common_prefix_blocks")
        affinity = None
        if shared is not None and common is not None:  # tokens some replicas hold and others do not
            affinity = routing.uncached_tokens(common) - routing.uncached_tokens(shared)
        slot = self._registry.claim(
            replica,
            decision,
            routing.estimated_total_tokens,
            uncached,
            prompt_tokens=routing.estimated_prompt_tokens,
            affinity_tokens=affinity,
            lowest_class=routing.cap_tier is CapTier.LOWEST,
        )
        if self._credits is not None:
            self._credits.on_dispatch(replica)
        return slot

    def cap_share(self, request: AdmissionRequest) -> float:
        """The share of a learned cap `request` may fill (`admission.lowest_class_reserve.cap_share`)."""
        model = self.pool.model if request.routing is None else request.routing.model
        return cap_share(
            request.priority,
            self._class_names,
            self._config.lowest_class_reserve,
            lambda: self.controller_for(model).above_rate_per_s(request.priority),
        )

    def try_dispatch(self, request: AdmissionRequest) -> Slot | None:
        """Admission's hook: a slot now, None to wait, `no_replica` when nothing is up at all."""
        assert request.routing is not None
        attempt, self._attempt = self._attempt, None
        share, views = attempt[1:] if attempt and attempt[0] is request else (self.cap_share(request), None)
        routing = request.routing if share == 1.0 else replace(request.routing, cap_share=share)
        keyed = keyed_policy(self.pool)
        slot = self.claim(routing, views) if keyed is None else claim_for_key(self, keyed, routing, views)
        if slot is None and not self.pool.has_eligible_replica(request.routing.model):
            raise self.no_replica(request.routing.model)
        return slot

    def try_at_deadline(self, request: AdmissionRequest) -> Slot | None:
        """Admission's last chance for a waiter whose class's wait ran out
        (`latency_model.deadline_headroom`): a slot within the headroom a learned cap leaves below the
        objective — the cap scaled by objective ÷ set point, 1 / `tpot_target_ratio` (1.25 by default) —
        instead of `queue_timeout`. Such a waiter was admitted on a forecast that a later cut of the cap
        broke; served now it still has the rest of its TTFT objective (`slo.queue_wait_ratio`), while
        the one extra sequence costs the replica's batch less than the set point's margin. A configured
        cap is not scaled, so without a learned one this is one more ordinary try."""
        assert request.routing is not None
        share = headroom_share(self.pool, self.cap_share(request))
        return self.claim(replace(request.routing, cap_share=share))

    def prefer_wait(self, request: AdmissionRequest, context: WaitContext) -> Hold | None:
        """Admission's hold hook (`prefix_wait.enabled`): keep waiting for the replica that holds the
        request's prefix while a free slot elsewhere would be a cache miss and the wait fits its TTFT
        objective — the routing prefix index's best match (`router.prefix_wait.owner_wait`), or for
        the rings the key's owner (`key_owner_wait`). None for a policy with neither, or at the
        process's connection limit (no slot anywhere: nothing to hold out against). No hold: what it
        took is kept for the `try_dispatch` that follows (module docstring)."""
        self._attempt = None
        routing = request.routing
        index = policy_prefix_index(self.pool.policy)
        keyed = keyed_policy(self.pool)
        if routing is None or (index is None and keyed is None):
            return None
        if not self.connections_free():
            return None
        if self._credits is not None:
            self._credits.sync(self.pool)
        c, share, borrow = context, self.cap_share(request), routing.borrows_lowest_place
        room = room_at_deadline(self.pool, share, borrow, c.now_s) if self._deadline_headroom() else None
        queue = QueueState(
            c.now_s, c.waited_s, c.deadline_s, c.mean_hold_s, c.ahead_by_key, c.mean_hold_s_by_key, room
        )
        views = self.pool.snapshot(share, borrow)
        if index is not None:
            wait = owner_wait(routing, views, index, queue, self.pool.settings.prefix_wait.min_match_ratio)
        else:
            owner = None if keyed is None else keyed.key_owner(routing, views)
            wait = None if owner is None else key_owner_wait(routing, views, owner, queue)
        if wait is None:  # (request, its cap share, views): for the try_dispatch that follows
            self._attempt = (request, share, views)
            return None
        return Hold(wait.replica_id, wait.until_s)

    def claim_excluding(self, routing: RoutingRequest, excluded: frozenset[str]) -> Slot | None:
        """A slot for a retry: routing again with the replicas that failed this request excluded."""
        return self.claim(replace(routing, exclude=excluded))

    def no_replica(self, model: str | None = None) -> AdmissionRefused:
        """The `no_replica` refusal (503), with the soonest timer that can bring a replica (serving
        `model`, when given) back."""
        if model is None or model == self.pool.model:
            why = f"no eligible replica for model {self.pool.model!r} (all down, draining or circuit-open)"
        else:
            why = (
                f"no eligible replica of pool {self.pool.model!r} serves {model!r} (none lists it, or "
                "all that do are down, draining or circuit-open)"
            )
        return AdmissionRefused(RejectReason.NO_REPLICA, self.pool.retry_after_s(model), why)


def _output_budget(request: AdmissionRequest) -> int | None:
    """The request's output budget in tokens (`max_tokens`), None when it set none."""
    return None if request.routing is None else request.routing.max_tokens


def _replica_id(slot: Slot) -> str:
    """The key admission times a slot's hold under (each replica's own mean hold, for `prefix_wait`)."""
    return slot.replica.replica_id
