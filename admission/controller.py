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
  (`call_soon`; never re-entered in place) that dispatches heads while `try_dispatch` answers with a
  slot: peek the head (highest class, WFQ order), ask `try_dispatch`, pop it only when a slot came
  back. `None` stops the round (no slot for anyone: the pool is uniform);
- an arrival: its fast-path probe is its wake-up. When it probed and got None there is no free slot;
  when it skipped the probe, others wait because there was none at the last release. Either way a
  further `try_dispatch` would only repeat a known answer (one wasted routing decision per arrival);
- one timer, at the queue's earliest deadline (`Timers.call_at`), answers expired waiters. The timer
  is re-armed only when a new deadline is earlier; a timer that fires early re-arms itself.

`try_dispatch(request) -> slot | None` is the only place that decides whether a replica has a free
slot: it routes `request.routing`, claims the slot synchronously and returns it (see
`admission.ticket.SlotHold`); the `Ticket` then holds it. It may raise `AdmissionRefused` (e.g.
`no_replica` when no replica is eligible at all): on the fast path that refusal propagates; from the
queue, that waiter gets it and the round continues with the next one. Any other exception fails
that waiter the same way.

Retry-After of every queue refusal: `queue_retry_after_s(ahead, r, drain_bound)` — `ahead` = waiters at
or above the class, r = the dispatch rate left to the class (`available_rate_per_s`: the pool's
capacity C = held tickets ÷ mean hold time, minus the measured dispatch rate of the classes above),
capped by the time by which everything ahead has left the queue; clamped to [1, max_retry_after_s].
An early refusal's Retry-After is its expected wait instead (see `AdmissionConfig`).

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
from admission.dispatch_rate import DispatchRateMeter
from admission.observer import AdmissionObserver, AdmissionStats
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_queue import (
    PriorityQueue,
    QueueEntry,
)
from admission.release_forecast import ReleaseForecast
from admission.retry_after import clamp_retry_after_s, queue_retry_after_s
from admission.tenant_gate import TenantGate
from admission.ticket import AdmissionRequest, S, Ticket
from admission.timers import LoopTimers, TimerHandle, Timers
from core.clock import Clock

_SLACK = 1e-9  # float noise in sums of rates must not cost a slot
OVERTAKE_MARGIN_SIGMAS = 2.0
"""Higher-class arrivals during a wait are Poisson: early refusal plans for their mean plus this many
standard deviations (√mean), so that a burst of them rarely turns an admitted waiter into a timeout."""


@dataclass(eq=False, slots=True)
class _Waiter(Generic[S]):
    request: AdmissionRequest
    future: asyncio.Future[tuple[S, float, int]]  # slot, queue wait, release-forecast key


class AdmissionController(Generic[S]):
    """Admission for one pool (see the module docstring)."""

    def __init__(
        self,
        try_dispatch: Callable[[AdmissionRequest], S | None],
        gate: TenantGate,
        *,
        clock: Clock,
        config: AdmissionConfig | None = None,
        observer: AdmissionObserver | None = None,
        timers: Timers | None = None,
        full_by_own_caps: Callable[[], bool] | None = None,
    ) -> None:
        self._config = config or AdmissionConfig()
        self._try_dispatch = try_dispatch
        self._full_by_own_caps = full_by_own_caps
        self._gate = gate
        self._clock = clock
        self._observer = observer
        self._timers: Timers = timers or LoopTimers(clock)
        self._queue: PriorityQueue[_Waiter[S]] = PriorityQueue(
            clock, self._config.classes, self._config.max_queue_depth
        )
        self._meter = DispatchRateMeter(clock)
        self._class_meters = {name: DispatchRateMeter(clock) for name in self._queue.class_names}
        self._forecast = ReleaseForecast(clock)
        self.stats = AdmissionStats()
        self._timer: TimerHandle | None = None
        self._timer_at_s = math.inf
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
        return self._meter.rate_per_s()

    def held_tickets(self) -> int:
        """Tickets given out and not yet released (the release forecast's population)."""
        return len(self._forecast)

    def above_rate_per_s(self, priority: str) -> float:
        """λ_above: measured dispatches per second of the classes strictly above `priority` (0 for the
        highest class, exactly)."""
        names = self._queue.class_names
        above = names[: names.index(self._queue.priority_class(priority).name)]
        return sum(self._class_meters[name].rate_per_s() or 0.0 for name in above)

    def available_rate_per_s(self, priority: str) -> float | None:
        """C − λ_above (≥ 0): the dispatches per second left to class `priority` and those below it
        while the pool is full (C: the measured dispatch rate until a ticket has been released); None
        before any dispatch. The rate of Retry-After estimates."""
        capacity = self.capacity_rate_per_s() or self._meter.rate_per_s()
        if capacity is None:
            return None
        return max(0.0, capacity - self.above_rate_per_s(priority))

    def capacity_rate_per_s(self) -> float | None:
        """C: dispatches per second the pool sustains while full — held tickets ÷ mean hold time; None
        before a ticket has been released or while none is held (no evidence)."""
        mean_hold_s = self._forecast.mean_hold_s
        if mean_hold_s is None or mean_hold_s <= 0 or not len(self._forecast):
            return None
        return len(self._forecast) / mean_hold_s

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

    async def _acquire_slot(self, request: AdmissionRequest) -> tuple[S, float, int]:
        priority = request.priority
        self._expire_due()
        if self._queue.ahead_of(priority) == 0:
            slot = self._try_dispatch(request)
            if slot is not None:
                return slot, 0.0, self._record_dispatch(priority, 0.0, fast_path=True)
        self._refuse_if_hopeless(priority)
        waiter: _Waiter[S] = _Waiter(request, asyncio.get_running_loop().create_future())
        pushed = self._queue.push(
            waiter, priority, request.tenant.name, request.estimated_tokens, request.weight
        )
        if pushed.entry is None:
            raise self._queue_refusal(RejectReason.QUEUE_FULL, priority, f"the {priority} queue is full")
        changed = {priority}
        if pushed.displaced is not None:
            self._refuse(pushed.displaced, RejectReason.QUEUE_FULL, "displaced by a higher-priority request")
            changed.add(pushed.displaced.priority)
        self._publish_depths(changed)
        self._arm_timer()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(pushed.entry)
            raise

    def _refuse_if_hopeless(self, priority: str) -> None:
        """Early refusal (see `AdmissionConfig.early_refusal_ratio`)."""
        config = self._config
        if config.early_refusal_ratio is None:
            return
        ahead = self._queue.ahead_of(priority)
        if config.early_refusal_needs_queue and ahead == 0:
            return
        if self._full_by_own_caps is not None and not self._full_by_own_caps():
            return  # blocked by a limit shared with other pools: their releases free slots too
        capacity = self.capacity_rate_per_s()
        max_wait_s = self._queue.priority_class(priority).max_wait_s
        budget_s = config.early_refusal_ratio * max_wait_s
        if capacity is None or not math.isfinite(capacity * budget_s):
            return
        above = self.above_rate_per_s(priority)
        margin = OVERTAKE_MARGIN_SIGMAS * math.sqrt(above * budget_s)
        need = ahead + 1 + above * budget_s + margin
        available = capacity - above
        if need > capacity * budget_s + _SLACK:
            if available <= 0:
                why = f"the classes above {priority} take all of this pool's capacity"
                raise self._early_refusal(priority, why, max_wait_s)  # nothing sooner is known
            wait_s = (ahead + 1 + margin) / available
            burst = " with a burst of higher-class arrivals" if margin > 0 else ""
            why = f"the {priority} queue would take about {wait_s:.1f} s{burst}"
            why += f", over its {max_wait_s:g} s limit"
            raise self._early_refusal(priority, why, wait_s)
        releases = math.ceil(need - _SLACK)
        if self._forecast.releases_due(releases, budget_s) is False:
            why = (
                f"the {priority} queue needs {releases} replica slots freed within {budget_s:g} s "
                "and the requests running now are not expected to free them in time"
            )
            due_s = self._forecast.time_until_releases_s(releases)
            raise self._early_refusal(priority, why, None if due_s is None else due_s - budget_s)

    def _early_refusal(self, priority: str, why: str, wait_s: float | None) -> AdmissionRefused:
        """429 `queue_full` at arrival; Retry-After is `wait_s`, when a retry could be admitted (the
        queue's Little's-law estimate when none is known)."""
        if wait_s is None:
            return self._queue_refusal(RejectReason.QUEUE_FULL, priority, why)
        retry_after_s = clamp_retry_after_s(wait_s, self._config.max_retry_after_s)
        return AdmissionRefused(RejectReason.QUEUE_FULL, retry_after_s, why, priority=priority)

    def _pump(self) -> None:
        self._pump_handle = None
        self._expire_due()
        self._dispatch_ready()
        self._arm_timer()

    def _dispatch_ready(self) -> None:
        while (entry := self._queue.peek_next()) is not None:
            waiter = entry.item
            if waiter.future.done():  # cancelled; its task has not run its handler yet
                self._drop(entry)
                continue
            try:
                slot = self._try_dispatch(waiter.request)
            except Exception as exc:  # a refusal (e.g. no_replica) or a bug: this waiter gets it
                self._drop(entry)
                waiter.future.set_exception(exc)
                continue
            if slot is None:
                return
            popped = self._queue.pop_next()
            assert popped is entry, "peek_next and pop_next disagree"
            queue_wait_s = entry.waited_s(self._clock.now_s())
            hold_key = self._record_dispatch(entry.priority, queue_wait_s, fast_path=False)
            waiter.future.set_result((slot, queue_wait_s, hold_key))
            self._publish_depths({entry.priority})

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
            refusal = self._queue_refusal(reason, entry.priority, f"{entry.priority} request {why}")
            entry.item.future.set_exception(refusal)

    def _queue_refusal(self, reason: RejectReason, priority: str, message: str) -> AdmissionRefused:
        retry_after_s = queue_retry_after_s(
            self._queue.ahead_of(priority),
            self.available_rate_per_s(priority),
            self._queue.drain_bound_s(priority),
            self._config.max_retry_after_s,
        )
        return AdmissionRefused(reason, retry_after_s, message, priority=priority)

    def _drop(self, entry: QueueEntry[_Waiter[S]]) -> None:
        self._queue.remove(entry)
        self._publish_depths({entry.priority})

    def _record_dispatch(self, priority: str, queue_wait_s: float, fast_path: bool) -> int:
        """Count a dispatch; returns its release-forecast key (the slot is held from now on)."""
        self._meter.record()
        self._class_meters[priority].record()
        self.stats.record_dispatch(priority, queue_wait_s, fast_path)
        if self._observer is not None:
            self._observer.dispatched(priority, queue_wait_s)
        return self._forecast.hold()

    def _publish_depths(self, priorities: set[str]) -> None:
        if self._observer is None:
            return
        for priority in priorities:
            self._observer.queue_depth_changed(priority, self._queue.depth(priority))

    def _arm_timer(self) -> None:
        next_s = self._queue.next_expiry_s()
        if next_s is None:
            self._cancel_timer()
            return
        if self._timer is not None and self._timer_at_s <= next_s:
            return  # fires no later than needed; `_on_timer` re-arms
        self._cancel_timer()
        self._timer = self._timers.call_at(next_s, self._on_timer)
        self._timer_at_s = next_s

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at_s = math.inf

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at_s = math.inf
        self._expire_due()
        self._arm_timer()
