"""What a request asks admission for (`AdmissionRequest`), and the one object it holds once admitted.

A `Ticket` is the single holder of everything an admitted request has taken: its replica slot(s), the
tenant's pass (rate-limit charge, bulkhead lease) and its key in the controller's `ReleaseForecast`.
Nothing else releases them, and `Ticket.release()` releases all of them, once, on every path (call it in
`finally`):

1. the forecast hears that the hold that began at dispatch has ended,
2. every slot is released, synchronously (a slot release must not await: the gateway's releases only
   schedule the admission pumps, they never run them in place),
3. the tenant's bulkhead lease is given back (awaited, shielded: see `TenantGate.leave`).

Slots are kept by role (`SlotRole`). An aggregated pool's request holds one `SERVE` slot; a
disaggregated pool's holds a `PREFILL` and a `DECODE` slot on two replicas, from admission on: its
`try_dispatch` returns them as one `SlotSet`, which the ticket holds role by role (never the set in one
role). A retry swaps the replica inside the ticket (`swap(role, new_slot)`): the old slot is released,
the new one held, and the tenant pass and forecast key stay — the request is still the same one,
holding the same place.

A slot is whatever the gateway's `try_dispatch` returns (one slot, or a `SlotSet`): it must already
hold the replica when it is returned (admission is synchronous between deciding and claiming) and its
`release()` must be idempotent (`SlotHold`). `Ticket.reconcile(actual)` corrects the token bucket once
the actual usage is known (once; later calls do nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeAlias, TypeVar

from admission.rate_limit import RateLimitResult
from admission.release_forecast import ReleaseForecast
from admission.tenant_gate import TenantGate, TenantPass
from admission.tenants import Tenant
from core.clock import Clock
from router.types import RoutingRequest


class SlotHold(Protocol):
    """A claimed replica slot; `release()` frees it (idempotent, synchronous)."""

    def release(self) -> None:
        """Free the slot; a no-op when already released."""
        ...


S = TypeVar("S", bound=SlotHold)


class SlotRole(StrEnum):
    """Which part of the work a slot's replica does for the request."""

    SERVE = "serve"
    """The one replica of an aggregated pool (prefill and decode on the same engine)."""
    PREFILL = "prefill"
    """Disaggregated pools: the replica that computes the prompt's KV cache."""
    DECODE = "decode"
    """Disaggregated pools: the replica that receives the KV cache and streams the tokens."""


class SlotSet(Generic[S]):
    """Slots claimed together by one dispatch, one per role (a disaggregated pool's prefill and decode
    slots). The ticket made from it holds each slot in its role; until then (a waiter cancelled after
    its dispatch) `release()` frees them all."""

    __slots__ = ("roles",)

    def __init__(self, roles: Mapping[SlotRole, S]) -> None:
        self.roles = dict(roles)

    def release(self) -> None:
        """Release every slot (each release is idempotent)."""
        for slot in self.roles.values():
            slot.release()


Dispatched: TypeAlias = "S | SlotSet[S]"
"""What `try_dispatch` gives for one request: its one slot, or a `SlotSet`."""


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One request asking for admission.

    `priority` must be one of the controller's classes (resolve it with
    `TenantDirectory.resolve_priority`); `estimated_tokens` = prompt tokens + max_tokens (what the
    token bucket is charged and the fair-share cost); `routing` is carried for `try_dispatch` to route
    with (admission never reads it). `weight` is the tenant's fair-share weight.
    """

    tenant: Tenant
    priority: str
    estimated_tokens: int = 0
    routing: RoutingRequest | None = None

    @property
    def weight(self) -> float:
        """The tenant's weight in weighted fair queuing within the class."""
        return self.tenant.weight

    @property
    def retry_key(self) -> int | None:
        """What a retry of this request shares with it (`admission.retry_lane`): its tenant, model,
        prompt and output budget, hashed in this process; None without a prompt to tell it by."""
        routing = self.routing
        if routing is None or not routing.prompt_text:
            return None
        return hash((self.tenant.name, routing.model, routing.prompt_text, routing.max_tokens))


class Ticket(Generic[S]):
    """An admitted request: its slots by role, the time it waited, and its one release path."""

    __slots__ = (
        "_clock",
        "_forecast",
        "_gate",
        "_hold_key",
        "_pass",
        "_released",
        "_slots",
        "dispatched_at_s",
        "queue_wait_s",
        "request",
    )

    def __init__(
        self,
        slot: Dispatched[S],
        request: AdmissionRequest,
        *,
        queue_wait_s: float,
        gate: TenantGate,
        tenant_pass: TenantPass,
        clock: Clock,
        forecast: ReleaseForecast | None = None,
        hold_key: int | None = None,
        role: SlotRole = SlotRole.SERVE,
    ) -> None:
        self._slots: dict[SlotRole, S] = dict(slot.roles) if isinstance(slot, SlotSet) else {role: slot}
        self.request = request
        self.queue_wait_s = queue_wait_s
        self.dispatched_at_s = clock.now_s()
        self._gate = gate
        self._pass = tenant_pass
        self._clock = clock
        self._released = False
        self._forecast = forecast  # the controller's; `hold_key` was registered in it at dispatch
        self._hold_key = hold_key

    @property
    def queue_wait_ms(self) -> float:
        """Queue wait in milliseconds (`x-gateway-queue-ms`, `Server-Timing: queue;dur=`)."""
        return self.queue_wait_s * 1000.0

    @property
    def rate_limit(self) -> RateLimitResult | None:
        """The allowed rate-limit decision (remaining quota, reset), None when the tenant is unlimited."""
        return self._pass.rate_limit

    @property
    def released(self) -> bool:
        """True once `release()` was called."""
        return self._released

    @property
    def slots(self) -> Mapping[SlotRole, S]:
        """The slots held now, by role (empty between a retry's release and its new claim)."""
        return self._slots

    def slot(self, role: SlotRole = SlotRole.SERVE) -> S | None:
        """The slot held in `role`, or None."""
        return self._slots.get(role)

    def swap(self, role: SlotRole, new: S | None) -> None:
        """Hold `new` in `role` (None: hold nothing there) and release the slot it replaces.

        A swap on a released ticket releases `new` at once: a ticket never holds a slot after its
        release (a retry that raced the request's end cannot leak one)."""
        old = self._slots.pop(role, None)
        if new is not None:
            if self._released:
                new.release()
            else:
                self._slots[role] = new
        if old is not None:
            old.release()

    async def release(self) -> None:
        """Release every slot, then the tenant's bulkhead lease. Idempotent; call it in `finally`."""
        if self._released:
            return
        self._released = True
        if self._forecast is not None and self._hold_key is not None:
            self._forecast.release(self._hold_key)
        slots, self._slots = list(self._slots.values()), {}
        try:
            for slot in slots:
                slot.release()
        finally:
            await self._gate.leave(self._pass, self._clock.now_s() - self.dispatched_at_s)

    async def reconcile(self, actual_tokens: int) -> None:
        """Charge the tenant's token bucket with the actual usage instead of the estimate (once)."""
        await self._gate.reconcile(self._pass, actual_tokens)
