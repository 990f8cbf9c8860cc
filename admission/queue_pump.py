"""The queue pump of one pool's admission: the waiters, and the three events that move them.

Event-driven, never polling. Three events move the queue:
- a release: the gateway calls `on_release()` (synchronous, on the loop's thread) whenever a replica
  slot may have freed — a slot released, a replica added or back to healthy. It schedules one pump
  (`call_soon`; never re-entered in place) that walks the waiters in dispatch order (highest class,
  WFQ order) and asks `try_dispatch` for each, taking it out only when a slot came back. `None` stops
  the round (no slot for anyone: the pool is uniform);
- an arrival: its fast-path probe is its wake-up. When it probed and got None there is no free slot;
  when it skipped the probe, others wait because there was none at the last release. Either way a
  further `try_dispatch` would only repeat a known answer — unless the last round passed over held
  waiters (`admission.holds`): a slot may be free, so an arrival queued behind them runs a round at
  once, with it in the queue, and early refusal (which counts every waiter ahead, the held ones too)
  is asked only when that round found it nothing;
- one timer (`EarliestTimer`), at the queue's earliest deadline, answers expired waiters (re-armed
  only when a new deadline is earlier; one that fires early re-arms itself); it also pumps when a hold
  runs out.

A waiter (`wait`) is refused `queue_full` when its class's queue is full, or displaces the youngest
waiter of the lowest lower class (that one gets `queue_full`); past its class's `max_wait_s` it gets
`queue_timeout`, always before it could be dispatched — unless `try_at_deadline` (optional; the gateway
lets it take a slot in the headroom above a learned cap, `PoolAdmission.try_at_deadline`) finds it a
slot at that moment, which is then dispatched as any queued waiter. A `try_dispatch` that raises fails
that waiter with the exception and the round goes on. A waiter whose task is cancelled leaves the queue
at once; a slot granted in the instant before the cancellation landed is given back (and its forecast
entry dropped), and the cancellation is counted in `stats.cancelled`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic

from admission.holds import Hold, Holds
from admission.observer import AdmissionStats
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_queue import PriorityQueue
from admission.queue_entry import QueueEntry
from admission.refusals import Refusals
from admission.release_forecast import ReleaseForecast
from admission.ticket import AdmissionRequest, Dispatched, S
from admission.timers import EarliestTimer, Timers
from core.clock import Clock


@dataclass(eq=False, slots=True)
class Waiter(Generic[S]):
    request: AdmissionRequest
    future: asyncio.Future[tuple[Dispatched[S], float, int]]  # slot(s), queue wait, release-forecast key
    hold: Hold | None = None  # its last answer from the prefer_wait hook
    held_since_s: float | None = None  # its first hold, until reported ended (admission.holds)
    held_for: str | None = None  # the key of its last hold

    def answered(self) -> bool:
        return self.future.done()


class QueuePump(Generic[S]):
    """The waiters of one pool's admission and their pump (see the module docstring). `dispatched`
    counts a queued dispatch and returns its release-forecast key; `key_of` names a slot's replica (for
    holds); `depths_changed` is told the classes whose depth changed."""

    def __init__(
        self,
        queue: PriorityQueue[Waiter[S]],
        try_dispatch: Callable[[AdmissionRequest], Dispatched[S] | None],
        *,
        clock: Clock,
        timers: Timers,
        holds: Holds,
        refusals: Refusals,
        forecast: ReleaseForecast,
        stats: AdmissionStats,
        dispatched: Callable[[AdmissionRequest, Dispatched[S], float], int],
        key_of: Callable[[Dispatched[S]], str | None],
        depths_changed: Callable[[set[str]], None],
        try_at_deadline: Callable[[AdmissionRequest], Dispatched[S] | None] | None = None,
    ) -> None:
        self._queue = queue
        self._try_at_deadline = try_at_deadline
        self._try_dispatch = try_dispatch
        self._clock = clock
        self._holds = holds
        self._refusals = refusals
        self._forecast = forecast
        self._stats = stats
        self._dispatched = dispatched
        self._key_of = key_of
        self._depths_changed = depths_changed
        self._timer = EarliestTimer(timers, self._on_timer)
        self._pump_handle: asyncio.Handle | None = None

    async def wait(
        self,
        request: AdmissionRequest,
        hold: Hold | None,
        *,
        round_first: bool,
        refusal: AdmissionRefused | None = None,
        first: bool = False,
    ) -> tuple[Dispatched[S], float, int]:
        """Queue `request` until a slot is dispatched to it (or it is refused); `hold`: its answer from
        the hook at arrival. `round_first`: it skipped the fast path (others wait before it) while the
        last round held waiters out, so a slot may be free for it: a round runs now with it in the
        queue (`_round_with_arrival`), and `refusal` (early refusal's verdict at arrival, if any) is
        raised only when that round found it nothing. `first`: a returning retry, queued ahead of its
        class (`admission.retry_lane`)."""
        waiter: Waiter[S] = Waiter(request, asyncio.get_running_loop().create_future())
        entry = self._push(waiter, first)
        if hold is not None:
            self._holds.set(waiter, hold)
        self._arm_timer()
        if round_first:
            self._round_with_arrival(entry, refusal)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(entry)
            raise
        finally:
            self._holds.left(waiter, cancelled=waiter.future.cancelled())

    def _push(self, waiter: Waiter[S], first: bool = False) -> QueueEntry[Waiter[S]]:
        """Queue `waiter` in its class and fair-share place (`queue_full` when there is none)."""
        request = waiter.request
        priority = request.priority
        pushed = self._queue.push(
            waiter, priority, request.tenant.name, request.estimated_tokens, request.weight, first=first
        )
        if pushed.entry is None:
            raise self._refusals.queue(RejectReason.QUEUE_FULL, priority, f"the {priority} queue is full")
        changed = {priority}
        if pushed.displaced is not None:
            self._refuse(pushed.displaced, RejectReason.QUEUE_FULL, "displaced by a higher-priority request")
            changed.add(pushed.displaced.priority)
        self._depths_changed(changed)
        return pushed.entry

    def _round_with_arrival(self, entry: QueueEntry[Waiter[S]], refusal: AdmissionRefused | None) -> None:
        """A pump round now, with the arrival in the queue, decides in dispatch order (a held waiter
        whose replica freed takes it first). Found no slot and not holding, the arrival gets the early
        refusal `refusal` as any arrival without a free slot: out of the queue, raised."""
        if self._pump_handle is not None:
            self._pump_handle.cancel()  # this round does its work now
        self._pump()
        waiter = entry.item
        if refusal is None or waiter.answered() or waiter.hold is not None:
            return
        self._drop(entry)  # its expiry may stay armed: a timer that finds nothing due re-arms itself
        raise refusal

    def on_release(self) -> None:
        """A replica slot may be free: schedule one pump (`call_soon`), unless one is scheduled or
        nobody waits."""
        if self._pump_handle is None and len(self._queue):
            self._pump_handle = asyncio.get_running_loop().call_soon(self._pump)

    def reject_waiting(self, reason: RejectReason, retry_after_s: int, message: str) -> int:
        """Refuse every waiter now; returns how many were refused."""
        entries = self._queue.expire(math.inf)
        for entry in entries:
            if not entry.item.future.done():
                entry.item.future.set_exception(
                    AdmissionRefused(reason, retry_after_s, message, priority=entry.priority)
                )
        self._depths_changed({entry.priority for entry in entries})
        self._arm_timer()
        return len(entries)

    def expire_due(self) -> None:
        """Answer the waiters past their class's `max_wait_s`: a slot from `try_at_deadline` when it
        finds one, else `queue_timeout`."""
        expired = self._queue.expire()
        for entry in expired:
            if self._last_chance(entry):
                continue
            spec = self._queue.priority_class(entry.priority)
            self._refuse(
                entry, RejectReason.QUEUE_TIMEOUT, f"got no replica slot within {spec.max_wait_s:g} s"
            )
        self._depths_changed({entry.priority for entry in expired})

    def _last_chance(self, entry: QueueEntry[Waiter[S]]) -> bool:
        """`try_at_deadline` for an expired waiter (already out of the queue); True when it was
        dispatched or failed with what the hook raised."""
        waiter = entry.item
        if self._try_at_deadline is None or waiter.future.done():
            return False
        try:
            slot = self._try_at_deadline(waiter.request)
        except Exception as exc:  # a refusal (e.g. no_replica) or a bug: this waiter gets it
            waiter.future.set_exception(exc)
            return True
        if slot is None:
            return False
        self._grant(entry, slot)
        return True

    def _grant(self, entry: QueueEntry[Waiter[S]], slot: Dispatched[S]) -> None:
        """Dispatch `slot` to a waiter already out of the queue."""
        waiter = entry.item
        queue_wait_s = entry.waited_s(self._clock.now_s())
        hold_key = self._dispatched(waiter.request, slot, queue_wait_s)
        self._holds.dispatched(waiter, self._key_of(slot))
        waiter.future.set_result((slot, queue_wait_s, hold_key))

    def _pump(self) -> None:
        self._pump_handle = None
        self.expire_due()
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
                self._holds.end_round(stopped_at=entry.priority)
                return
            self._queue.take(entry)  # queued: walked in dispatch order, nothing removed it since
            self._grant(entry, slot)
            self._depths_changed({entry.priority})
        self._holds.end_round(stopped_at=None)

    def _abandon(self, entry: QueueEntry[Waiter[S]]) -> None:
        """The waiter's task was cancelled: leave the queue, or give back a slot granted meanwhile."""
        future = entry.item.future
        if self._queue.remove(entry):
            self._depths_changed({entry.priority})
            self._arm_timer()
        if not future.done():
            future.cancel()
        if not future.cancelled() and future.exception() is not None:  # refused first; now retrieved
            return
        self._stats.cancelled[entry.priority] += 1
        if future.cancelled():
            return
        slot, _, hold_key = future.result()  # dispatched in the instant before the cancellation landed
        self._forecast.discard(hold_key)
        slot.release()
        self.on_release()

    def _refuse(self, entry: QueueEntry[Waiter[S]], reason: RejectReason, why: str) -> None:
        """Answer a waiter already taken out of the queue (displaced or expired)."""
        if not entry.item.future.done():
            refusal = self._refusals.queue(reason, entry.priority, f"{entry.priority} request {why}")
            entry.item.future.set_exception(refusal)

    def _drop(self, entry: QueueEntry[Waiter[S]]) -> None:
        self._queue.remove(entry)
        self._depths_changed({entry.priority})

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
        self.expire_due()
        self._arm_timer()
