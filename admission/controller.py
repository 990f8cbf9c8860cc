"""Admission control for one pool: tenant limits → fast path or priority queue → a replica slot.

`await controller.admit(request)` returns a `Ticket` or raises `AdmissionRefused`:

1. tenant stage (`TenantGate.enter`): rate limits, then the bulkhead → 429 `rate_limited`;
2. fast path: when nobody of equal or higher priority waits, `try_dispatch(request)` at once; a slot
   means "dispatched", with a queue wait of 0;
3. otherwise the request waits in the `PriorityQueue` (classes highest first, WFQ across tenants on
   estimated tokens within a class — FIFO for one tenant) on a future. A full queue refuses it
   (`queue_full`), or admits it by displacing the youngest waiter of the lowest lower class (that one
   gets `queue_full`). A waiter past its class's `max_wait_s` gets `queue_timeout`, always before it
   could be dispatched. A waiter whose task is cancelled (client gone) leaves the queue at once and
   `try_dispatch` is never called for it again (only its fast-path probe, before it queued, was).

The queue moves on events, never by polling: a release (`on_release`), an arrival, and one timer at the
queue's earliest deadline (`admission.queue_pump`).

Holds (`admission.holds`, optional `prefer_wait` hook, asked before `try_dispatch`): a waiter may
rather wait for one resource (the replica holding its prefix) until a time. The pump passes over it,
so those behind it may take the slot it declined (no head-of-line blocking), and asks it again at the
next pump; at its `until_s` it is let go. An arrival that holds is queued. Without the hook: unchanged.
With `slot_key` (slot → replica id), each ticket's hold time also feeds its replica's own mean hold
(`ReleaseForecast.mean_hold_s_by_key`), which the hook reads in its `WaitContext`, and a holder's
dispatch is told apart: to the key it held for, or elsewhere. Each holder is reported to the observer
when it first holds and when it leaves the queue (`held`, `HoldOutcome`; `stats.holds`).

`try_dispatch(request) -> slot | None` is the only place that decides whether a replica has a free
slot: it routes `request.routing`, claims the slot (or a `SlotSet`, one slot per role) synchronously
and returns it (see `admission.ticket.SlotHold`); the `Ticket` then holds it. It may raise
`AdmissionRefused` (e.g. `no_replica` when no replica is eligible at all): on the fast path that refusal
propagates; from the queue, that waiter gets it and the round continues with the next one. Any other
exception fails that waiter the same way.

Refusals and their Retry-After — early refusal at arrival, a waiter's refusal — are
`admission.refusals`'. `try_at_deadline(request) -> slot | None` (optional) is a waiter's last chance
when its class's `max_wait_s` runs out: a slot it returns is dispatched as any queued one
(`admission.queue_pump`), None lets the `queue_timeout` refusal stand.

The retry lane (`admission.retry_lane`, booked by `admission.retry_booking`; on with
`retry_lane_share` > 0, for requests with a `retry_key`): a queue refusal (`queue_full`,
`queue_timeout`) books its retry a place when the forecast gives one, and its Retry-After says when;
an arrival that claims its place is *returning*: it probes for a slot unless the classes above or
other returning requests wait, queues at the head of its class, and early refusal counts only what is
ahead of it there. Promises, claims, refusals without a place and returning requests refused all the
same (`broken`) are reported (`retry_lane`).

Every refusal raised by `admit` is counted in `stats.rejected` and reported to the observer once.
Tokens charged by the rate limiter are refunded when the request does not run (see `TenantGate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic

from admission.config import AdmissionConfig
from admission.dispatch_rate import PoolRates
from admission.holds import Hold, Holds, PreferWait
from admission.observer import AdmissionObserver, AdmissionStats
from admission.outcomes import AdmissionRefused, HoldOutcome, RejectReason
from admission.priority_queue import PriorityQueue
from admission.queue_pump import QueuePump, Waiter
from admission.refusals import Refusals
from admission.release_forecast import ReleaseForecast
from admission.retry_booking import RetryBooking
from admission.retry_lane import RetryLane
from admission.tenant_gate import TenantGate
from admission.ticket import AdmissionRequest, Dispatched, S, SlotSet, Ticket
from admission.timers import LoopTimers, Timers
from core.clock import Clock


class AdmissionController(Generic[S]):
    """Admission for one pool (see the module docstring)."""

    def __init__(
        self,
        try_dispatch: Callable[[AdmissionRequest], Dispatched[S] | None],
        gate: TenantGate,
        *,
        clock: Clock,
        config: AdmissionConfig | None = None,
        observer: AdmissionObserver | None = None,
        timers: Timers | None = None,
        full_by_own_caps: Callable[[], bool] | None = None,
        prefer_wait: PreferWait | None = None,
        slot_key: Callable[[S], str] | None = None,
        output_tokens: Callable[[AdmissionRequest], int | None] | None = None,
        seconds_per_token: Callable[[], float | None] | None = None,
        slots_over_caps: Callable[[AdmissionRequest], int] | None = None,
        try_at_deadline: Callable[[AdmissionRequest], Dispatched[S] | None] | None = None,
    ) -> None:
        self._config = config or AdmissionConfig()
        self._try_dispatch = try_dispatch
        self._gate = gate
        self._clock = clock
        self._observer = observer
        self._queue: PriorityQueue[Waiter[S]] = PriorityQueue(
            clock, self._config.classes, self._config.max_queue_depth
        )
        self._forecast = ReleaseForecast(clock, seconds_per_token=seconds_per_token)
        self._rates = PoolRates(clock, self._queue.class_names, self._forecast)
        self._holds = Holds(prefer_wait, clock, self._forecast, self._report_hold)
        self._slot_key = slot_key
        self._output_tokens = output_tokens
        self._refusals = Refusals(
            self._config,
            self._queue,
            self._rates,
            self._forecast,
            full_by_own_caps=full_by_own_caps,
            slots_over_caps=slots_over_caps,
        )
        self.stats = AdmissionStats()
        self._retry_booking = RetryBooking(
            RetryLane(self._config.retry_lane_share, self._config.retry_lane_horizon_s),
            clock=clock,
            queue=self._queue,
            rates=self._rates,
            forecast=self._forecast,
            refusals=self._refusals,
            observer=observer,
        )
        self._queue_pump = QueuePump(
            self._queue,
            try_dispatch,
            clock=clock,
            timers=timers or LoopTimers(clock),
            holds=self._holds,
            refusals=self._refusals,
            forecast=self._forecast,
            stats=self.stats,
            dispatched=lambda request, slot, wait_s: self._record_dispatch(
                request, slot, wait_s, queued=True
            ),
            key_of=self._key_of,
            depths_changed=self._publish_depths,
            try_at_deadline=try_at_deadline,
        )

    def __len__(self) -> int:
        """Waiters in the queue."""
        return len(self._queue)

    @property
    def class_names(self) -> tuple[str, ...]:
        """Priority classes, highest first (give them to `TenantDirectory`)."""
        return self._queue.class_names

    def depths(self) -> dict[str, int]:
        """Waiters per class, highest first."""
        return self._queue.depths()

    def dispatch_rate_per_s(self) -> float | None:
        """Measured dispatches per second (None before the first)."""
        return self._rates.rate_per_s()

    def held_tickets(self) -> int:
        """Tickets given out and not yet released (the release forecast's population)."""
        return len(self._forecast)

    def above_rate_per_s(self, priority: str) -> float:
        """λ_above of class `priority` (`PoolRates.above_per_s`)."""
        return self._rates.above_per_s(self._queue.priority_class(priority).name)

    def available_rate_per_s(self, priority: str) -> float | None:
        """C − λ_above of class `priority` (`PoolRates.available_per_s`): the rate of Retry-After."""
        return self._rates.available_per_s(self._queue.priority_class(priority).name)

    def capacity_rate_per_s(self) -> float | None:
        """C = held tickets ÷ mean hold time (`PoolRates.capacity_per_s`)."""
        return self._rates.capacity_per_s()

    async def admit(self, request: AdmissionRequest) -> Ticket[S]:
        """Admit `request` or raise `AdmissionRefused`; ValueError for an unknown class or negative
        tokens (programming errors, raised before anything is charged)."""
        self._queue.priority_class(request.priority)
        if request.estimated_tokens < 0:
            raise ValueError(f"estimated_tokens must be ≥ 0 (got {request.estimated_tokens})")
        first = False
        try:
            tenant_pass = await self._gate.enter(request.tenant, request.estimated_tokens, request.priority)
            try:
                first = self._retry_booking.claim(request)
                slot, queue_wait_s, hold_key = await self._acquire_slot(request, first)
            except BaseException:
                self._gate.abandon(tenant_pass)
                raise
        except AdmissionRefused as refusal:
            self._retry_booking.refused(request, refusal, returning=first)
            self.stats.rejected[refusal.reason] += 1
            if self._observer is not None:
                self._observer.rejected(refusal.reason, request.priority)
            raise
        return Ticket(
            slot,
            request,
            queue_wait_s=queue_wait_s,
            gate=self._gate,
            tenant_pass=tenant_pass,
            clock=self._clock,
            forecast=self._forecast,
            hold_key=hold_key,
        )

    def on_release(self) -> None:
        """A replica slot may be free: schedule one pump on the event loop (`call_soon`) that dispatches
        as many waiters as then fit. Never runs the pump in place, so a release inside `try_dispatch`,
        a slot's `release()` or another pool's pump cannot re-enter it; many releases in one loop
        iteration cost one pump."""
        self._queue_pump.on_release()

    def reject_waiting(self, reason: RejectReason, retry_after_s: int, message: str) -> int:
        """Refuse every waiter now (e.g. `draining` at shutdown); returns how many were refused."""
        return self._queue_pump.reject_waiting(reason, retry_after_s, message)

    @property
    def retry_lane(self) -> RetryLane:
        """The pool's retry lane (its promises and counts)."""
        return self._retry_booking.lane

    async def _acquire_slot(self, request: AdmissionRequest, first: bool) -> tuple[Dispatched[S], float, int]:
        priority = request.priority
        self._rates.arrived(self._queue.priority_class(priority).name)
        self._queue_pump.expire_due()
        if first:
            ahead = self._queue.ahead_of_arrival(
                priority, request.tenant.name, request.estimated_tokens, request.weight, first=True
            )
        else:
            ahead = self._queue.ahead_of(priority)
        probed = ahead == 0
        hold: Hold | None = None
        if probed:
            max_wait_s = self._queue.priority_class(priority).max_wait_s
            hold = self._holds.at_arrival(request, max_wait_s)
            slot = None if hold is not None else self._try_dispatch(request)
            if slot is not None:
                return slot, 0.0, self._record_dispatch(request, slot, 0.0)
            self._holds.arrival_answered(priority, hold)
        refusal = None if hold is not None else self._refusals.hopeless(request, first=first)
        round_first = not probed and self._may_be_free_for(priority)
        if refusal is not None and not round_first:
            raise refusal
        return await self._queue_pump.wait(
            request, hold, round_first=round_first, refusal=refusal, first=first
        )

    def _may_be_free_for(self, priority: str) -> bool:
        """Whether the last round may have left a slot for an arrival of class `priority` behind
        waiters: it held waiters out, and it did not stop on one dispatched before such an arrival
        (no slot for a waiter of its class or above is none for it). A round that stopped on a class
        below saw that class's slots only: the lowest class fills less of a learned cap than the
        others (`admission.lowest_class_reserve`), and an arrival above it behind waiters holding
        for their own replica was refused at arrival while a replica had room for it."""
        holds = self._holds
        if not holds.held_any:
            return False
        if holds.stopped_at is None:
            return True
        names = self._queue.class_names
        return names.index(holds.stopped_at) > names.index(priority)

    def _key_of(self, slot: Dispatched[S]) -> str | None:
        return None if self._slot_key is None or isinstance(slot, SlotSet) else self._slot_key(slot)

    def _record_dispatch(
        self, request: AdmissionRequest, slot: Dispatched[S], queue_wait_s: float, queued: bool = False
    ) -> int:
        """Count a dispatch; returns its release-forecast key (the slot is held from now on, on the
        replica `slot_key` names; its output budget feeds the forecast's prior)."""
        priority = request.priority
        self._rates.record(priority, queued)
        self.stats.record_dispatch(priority, queue_wait_s, fast_path=not queued)
        if self._observer is not None:
            self._observer.dispatched(priority, queue_wait_s)
        budget = None if self._output_tokens is None else self._output_tokens(request)
        return self._forecast.hold(self._key_of(slot), output_tokens=budget)

    def _report_hold(self, outcome: HoldOutcome, held_s: float) -> None:
        self.stats.holds[outcome] += 1
        if self._observer is not None:
            self._observer.held(outcome, held_s)

    def _publish_depths(self, priorities: set[str]) -> None:
        if self._observer is None:
            return
        for priority in priorities:
            self._observer.queue_depth_changed(priority, self._queue.depth(priority))
