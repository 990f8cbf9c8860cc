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

Event-driven, never polling. Three events move the queue:
- a release: the gateway calls `on_release()` (synchronous, on the loop's thread) whenever a replica
  slot may have freed — a slot released, a replica added or back to healthy. It schedules one pump
  (`call_soon`; never re-entered in place) that walks the waiters in dispatch order (highest class,
  WFQ order) and asks `try_dispatch` for each, taking it out only when a slot came back. `None` stops
  the round (no slot for anyone: the pool is uniform);
- an arrival: its fast-path probe is its wake-up. When it probed and got None there is no free slot;
  when it skipped the probe, others wait because there was none at the last release. Either way a
  further `try_dispatch` would only repeat a known answer — unless the last round passed over held
  waiters (below): a slot may be free, so a queued arrival schedules a pump;
- one timer (`EarliestTimer`), at the queue's earliest deadline, answers expired waiters (re-armed
  only when a new deadline is earlier; one that fires early re-arms itself); it also pumps when a hold
  runs out.

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
`admission.refusals`'.

Every refusal raised by `admit` is counted in `stats.rejected` and reported to the observer once.
Tokens charged by the rate limiter are refunded when the request does not run (see `TenantGate`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic

from admission.config import AdmissionConfig
from admission.dispatch_rate import PoolRates
from admission.holds import Hold, Holds, PreferWait
from admission.observer import AdmissionObserver, AdmissionStats
from admission.outcomes import AdmissionRefused, HoldOutcome, RejectReason
from admission.priority_queue import PriorityQueue, QueueEntry
from admission.refusals import Refusals
from admission.release_forecast import ReleaseForecast
from admission.tenant_gate import TenantGate
from admission.ticket import AdmissionRequest, Dispatched, S, SlotSet, Ticket
from admission.timers import EarliestTimer, LoopTimers, Timers
from core.clock import Clock


@dataclass(eq=False, slots=True)
class _Waiter(Generic[S]):
    request: AdmissionRequest
    future: asyncio.Future[tuple[Dispatched[S], float, int]]  # slot(s), queue wait, release-forecast key
    hold: Hold | None = None  # its last answer from the prefer_wait hook
    held_since_s: float | None = None  # its first hold, until reported ended (admission.holds)
    held_for: str | None = None  # the key of its last hold

    def answered(self) -> bool:
        return self.future.done()


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
    ) -> None:
        self._config = config or AdmissionConfig()
        self._try_dispatch = try_dispatch
        self._gate = gate
        self._clock = clock
        self._observer = observer
        self._queue: PriorityQueue[_Waiter[S]] = PriorityQueue(
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
        self._timer = EarliestTimer(timers or LoopTimers(clock), self._on_timer)
        self._pump_handle: asyncio.Handle | None = None

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
        try:
            tenant_pass = await self._gate.enter(request.tenant, request.estimated_tokens, request.priority)
            try:
                slot, queue_wait_s, hold_key = await self._acquire_slot(request)
            except BaseException:
                self._gate.abandon(tenant_pass)
                raise
        except AdmissionRefused as refusal:
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
        if self._pump_handle is None and len(self._queue):
            self._pump_handle = asyncio.get_running_loop().call_soon(self._pump)

    def reject_waiting(self, reason: RejectReason, retry_after_s: int, message: str) -> int:
        """Refuse every waiter now (e.g. `draining` at shutdown); returns how many were refused."""
        entries = self._queue.expire(math.inf)
        for entry in entries:
            if not entry.item.future.done():
                entry.item.future.set_exception(
                    AdmissionRefused(reason, retry_after_s, message, priority=entry.priority)
                )
        self._publish_depths({entry.priority for entry in entries})
        self._arm_timer()
        return len(entries)

    async def _acquire_slot(self, request: AdmissionRequest) -> tuple[Dispatched[S], float, int]:
        priority = request.priority
        self._rates.arrived(self._queue.priority_class(priority).name)
        self._expire_due()
        probed = self._queue.ahead_of(priority) == 0
        hold: Hold | None = None
        if probed:
            max_wait_s = self._queue.priority_class(priority).max_wait_s
            hold = self._holds.at_arrival(request, max_wait_s)
            slot = None if hold is not None else self._try_dispatch(request)
            if slot is not None:
                return slot, 0.0, self._record_dispatch(request, slot, 0.0)
            self._holds.may_be_free = hold is not None
        if hold is None:
            self._refusals.raise_if_hopeless(request)
        waiter: _Waiter[S] = _Waiter(request, asyncio.get_running_loop().create_future())
        pushed = self._queue.push(
            waiter, priority, request.tenant.name, request.estimated_tokens, request.weight
        )
        if pushed.entry is None:
            raise self._refusals.queue(RejectReason.QUEUE_FULL, priority, f"the {priority} queue is full")
        changed = {priority}
        if pushed.displaced is not None:
            self._refuse(pushed.displaced, RejectReason.QUEUE_FULL, "displaced by a higher-priority request")
            changed.add(pushed.displaced.priority)
        self._publish_depths(changed)
        if hold is not None:
            self._holds.set(waiter, hold)
        self._arm_timer()
        if not probed and self._holds.may_be_free:
            self.on_release()  # waiters held out in the last round: a slot may be free for this one
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(pushed.entry)
            raise
        finally:
            self._holds.left(waiter, cancelled=waiter.future.cancelled())

    def _pump(self) -> None:
        self._pump_handle = None
        self._expire_due()
        self._dispatch_ready()
        self._arm_timer()

    def _dispatch_ready(self) -> None:
        self._holds.start_round()
        for entry in self._queue.in_dispatch_order():
            waiter = entry.item
            if waiter.future.done():  # cancelled; its task has not run its handler yet
                self._drop(entry)
                continue
            try:
                waited_s = entry.waited_s(self._clock.now_s())
                hold = self._holds.in_round(waiter, waited_s, entry.deadline_s)
                slot = None if hold is not None else self._try_dispatch(waiter.request)
            except Exception as exc:  # a refusal (e.g. no_replica) or a bug: this waiter gets it
                self._drop(entry)
                waiter.future.set_exception(exc)
                continue
            if hold is not None:
                continue  # held out: the waiters behind it may take the slot it declined
            if slot is None:
                self._holds.end_round(stopped=True)
                return
            self._queue.take(entry)  # queued: walked in dispatch order, nothing removed it since
            queue_wait_s = entry.waited_s(self._clock.now_s())
            hold_key = self._record_dispatch(waiter.request, slot, queue_wait_s, queued=True)
            self._holds.dispatched(waiter, self._key_of(slot))
            waiter.future.set_result((slot, queue_wait_s, hold_key))
            self._publish_depths({entry.priority})
        self._holds.end_round(stopped=False)

    def _abandon(self, entry: QueueEntry[_Waiter[S]]) -> None:
        """The waiter's task was cancelled: leave the queue, or give back a slot granted meanwhile."""
        future = entry.item.future
        if self._queue.remove(entry):
            self._publish_depths({entry.priority})
            self._arm_timer()
        if not future.done():
            future.cancel()
        if not future.cancelled() and future.exception() is not None:  # refused first; now retrieved
            return
        self.stats.cancelled[entry.priority] += 1
        if future.cancelled():
            return
        slot, _, hold_key = future.result()  # dispatched in the instant before the cancellation landed
        self._forecast.discard(hold_key)
        slot.release()
        self.on_release()

    def _expire_due(self) -> None:
        expired = self._queue.expire()
        for entry in expired:
            spec = self._queue.priority_class(entry.priority)
            self._refuse(
                entry, RejectReason.QUEUE_TIMEOUT, f"got no replica slot within {spec.max_wait_s:g} s"
            )
        self._publish_depths({entry.priority for entry in expired})

    def _refuse(self, entry: QueueEntry[_Waiter[S]], reason: RejectReason, why: str) -> None:
        """Answer a waiter already taken out of the queue (displaced or expired)."""
        if not entry.item.future.done():
            refusal = self._refusals.queue(reason, entry.priority, f"{entry.priority} request {why}")
            entry.item.future.set_exception(refusal)

    def _drop(self, entry: QueueEntry[_Waiter[S]]) -> None:
        self._queue.remove(entry)
        self._publish_depths({entry.priority})

    def _key_of(self, slot: Dispatched[S]) -> str | None:
        return None if self._slot_key is None or isinstance(slot, SlotSet) else self._slot_key(slot)

    def _record_dispatch(
        self, request: AdmissionRequest, slot: Dispatched[S], queue_wait_s: float, queued: bool = False
    ) -> int:
        """Count a dispatch; returns its release-forecast key (the slot is held from now on, on the
        replica `slot_key` names; its output budget feeds the forecast's prior)."""
        priority = request.priority
        self._rates.record(priority)
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

    def _arm_timer(self) -> None:
        expiry_s, hold_s = self._queue.next_expiry_s(), self._holds.next_s()
        next_s = expiry_s if hold_s is None else hold_s if expiry_s is None else min(expiry_s, hold_s)
        self._timer.arm(next_s)  # re-armed only when earlier; `_on_timer` re-arms for the rest

    def _on_timer(self) -> None:
        if self._holds.pop_due():
            if self._pump_handle is not None:  # this pump does its work now
                self._pump_handle.cancel()
            self._pump()  # a hold ran out: that waiter may now take a slot elsewhere
            return
        self._expire_due()
        self._arm_timer()
