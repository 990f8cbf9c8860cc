"""Holds: a queued request that would rather wait for one specific resource than take a free slot now.

The controller is generic over what a slot is; the gateway gives it an optional `PreferWait` hook
besides `try_dispatch`. Before asking `try_dispatch` for a waiter, the controller asks the hook, with
what it knows of the waiter (`WaitContext`); an answer `Hold(key, until_s)` means "do not dispatch me
now: I wait for `key` (e.g. the replica holding my prompt's prefix) until `until_s` at the latest".
The waiter then stays queued in its place (class, fair-share order, deadline unchanged) and the pump
goes on to the waiters behind it, which may take the free slot it declined. It is asked again at
every later pump (each release), and at `until_s` a timer runs a pump, where the hook is expected to
let it go (a hold whose `until_s` has passed is ignored): no waiter holds past its own answer, and the
queue's `max_wait_s` still answers `queue_timeout` as before.

Within one pump round nothing is released (a round is synchronous), so once a waiter answered
`Hold(key)` in the round, later waiters that held for the same `key` at their last answer (and whose
`until_s` has not passed) are passed over without asking again: a round costs one hook call per
resource waited for, not one per waiter. `WaitContext.ahead_by_key` counts the waiters before this one
in the round's dispatch order that hold for each key (what a waiter's own wait for that resource
depends on); at arrival (the fast path) it is empty: nobody of its class or above is queued then. An
arrival behind waiters that the last round held out is asked in a round of its own, run at once
(`admission.queue_pump`): they declined the slots that round found, which may be free for it — unless
that round stopped on a waiter of the arrival's class or above, for which no slot was free
(`AdmissionController._may_be_free_for`; a round that stopped on a class below saw only that class's
share of the caps).

A waiter's holding is reported to `report` (the controller's observer) twice: `HELD` at its first
`Hold` (never again for it, whatever it answers later), then how it left the queue — dispatched to the
key it held for last (`OWNER`) or elsewhere (`SPILLED`), refused, or cancelled — with the seconds since
that first hold (`HoldOutcome`). A waiter that never held is never reported.

`Holds` is the controller's bookkeeping of all this; `HoldDeadlines` keeps the holds' `until_s` for
the controller's one timer: a min-heap, entries dropped
lazily once their waiter holds something else or has left (so a hold costs O(log n), never a scan).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from admission.outcomes import HoldOutcome
from admission.release_forecast import ReleaseForecast
from admission.ticket import AdmissionRequest
from core.clock import Clock


@dataclass(frozen=True, slots=True)
class Hold:
    """Wait for `key` until `until_s` (clock seconds) rather than take a slot elsewhere now."""

    key: str
    until_s: float


@dataclass(frozen=True, slots=True)
class WaitContext:
    """What the controller knows about a waiter when it asks the hook (clock seconds).

    `deadline_s`: when its class's `max_wait_s` answers `queue_timeout`; `mean_hold_s`: the mean time a
    slot is held, dispatch → release (`ReleaseForecast.mean_hold_s`, None before the first release);
    `ahead_by_key`: waiters ahead of it holding for each key (module docstring); `mean_hold_s_by_key`:
    each key's own mean hold, for keys with enough holds (`ReleaseForecast.mean_hold_s_by_key`; empty
    when the controller has no `slot_key`). Both mappings are live views: read them during the call."""

    now_s: float
    waited_s: float
    deadline_s: float
    mean_hold_s: float | None
    ahead_by_key: Mapping[str, int]
    mean_hold_s_by_key: Mapping[str, float]


PreferWait = Callable[[AdmissionRequest, WaitContext], Hold | None]
"""The hook: a `Hold` to keep waiting, None to be dispatched now (to whatever `try_dispatch` finds).
Synchronous, on the loop's thread; an exception fails that waiter as one from `try_dispatch` does."""


class HeldWaiter(Protocol):
    """A queued waiter as holds see it: its request, current hold (None: none), whether it was answered,
    and, once it has held, since when (`held_since_s`) and for which key last (`held_for`)."""

    request: AdmissionRequest
    hold: Hold | None
    held_since_s: float | None
    held_for: str | None

    def answered(self) -> bool: ...


class Holds:
    """The controller's side of holds: asks the hook, remembers each waiter's answer and the held-out
    keys of the current pump round, and keeps the holds' deadlines (module docstring)."""

    def __init__(
        self,
        prefer_wait: PreferWait | None,
        clock: Clock,
        forecast: ReleaseForecast,
        report: Callable[[HoldOutcome, float], None],
    ) -> None:
        self._prefer_wait = prefer_wait
        self._clock = clock
        self._forecast = forecast
        self._report = report
        self._deadlines = HoldDeadlines()
        self._held_out: set[str] = set()
        self._ahead: Counter[str] = Counter()
        self.held_any = False
        """The last pump round held waiters out: a slot they declined may be free for another."""
        self.stopped_at: str | None = None
        """The class of the waiter the last round stopped on (no slot for it); None: it did not stop."""

    def at_arrival(self, request: AdmissionRequest, max_wait_s: float) -> Hold | None:
        """The hook's answer for an arrival that nobody of its class or above waits before."""
        if self._prefer_wait is None:
            return None
        now_s = self._clock.now_s()
        context = self._context(now_s, 0.0, now_s + max_wait_s, {})
        return live_hold(self._prefer_wait(request, context), now_s)

    def start_round(self) -> None:
        """A pump round begins: no key is held out for yet."""
        self._held_out.clear()
        self._ahead.clear()

    def in_round(self, waiter: HeldWaiter, waited_s: float, deadline_s: float) -> Hold | None:
        """The waiter's hold in this round: its last one, unasked, while it has not run out and its key
        was already held out for in this round (nothing frees during a round); else the hook's answer.
        A hold counts the waiter as ahead of the later ones holding for the same key."""
        if self._prefer_wait is None:
            return None
        now_s = self._clock.now_s()
        hold = live_hold(waiter.hold, now_s)
        if hold is None or hold.key not in self._held_out:
            context = self._context(now_s, waited_s, deadline_s, self._ahead)
            hold = live_hold(self._prefer_wait(waiter.request, context), now_s)
            self.set(waiter, hold)
        if hold is not None:
            self._held_out.add(hold.key)
            self._ahead[hold.key] += 1
        return hold

    def _context(
        self, now_s: float, waited_s: float, deadline_s: float, ahead: Mapping[str, int]
    ) -> WaitContext:
        forecast = self._forecast
        return WaitContext(
            now_s, waited_s, deadline_s, forecast.mean_hold_s, ahead, forecast.mean_hold_s_by_key
        )

    def end_round(self, stopped_at: str | None) -> None:
        """The round ended on a waiter of class `stopped_at` that found no slot, or (None) after the
        last waiter."""
        self.held_any = bool(self._held_out)
        self.stopped_at = stopped_at

    def arrival_answered(self, priority: str, hold: Hold | None) -> None:
        """An arrival first in line was held (a slot it declined may be free), or found no slot in
        class `priority` (as a round stopping on it)."""
        self.held_any = hold is not None
        self.stopped_at = None if hold is not None else priority

    def set(self, waiter: HeldWaiter, hold: Hold | None) -> None:
        """`waiter` holds `hold` now (None: nothing); its first hold is reported `HELD`."""
        if hold is not None and hold != waiter.hold:
            self._deadlines.add(waiter, hold)
            waiter.held_for = hold.key
            if waiter.held_since_s is None:
                waiter.held_since_s = self._clock.now_s()
                self._report(HoldOutcome.HELD, 0.0)
        waiter.hold = hold

    def dispatched(self, waiter: HeldWaiter, slot_key: str | None) -> None:
        """`waiter` got a slot on `slot_key` (None: unknown): `OWNER` when that is the key it held for
        last, else `SPILLED`; nothing when it never held."""
        owner = slot_key is not None and slot_key == waiter.held_for
        self._end(waiter, HoldOutcome.OWNER if owner else HoldOutcome.SPILLED)

    def left(self, waiter: HeldWaiter, cancelled: bool) -> None:
        """`waiter` is done waiting: `CANCELLED` (its caller left) or `REFUSED` when it held and was not
        dispatched; nothing otherwise (never held, or already reported by `dispatched`)."""
        self._end(waiter, HoldOutcome.CANCELLED if cancelled else HoldOutcome.REFUSED)

    def _end(self, waiter: HeldWaiter, outcome: HoldOutcome) -> None:
        since_s = waiter.held_since_s
        if since_s is None:
            return
        waiter.held_since_s = None  # reported once
        self._report(outcome, max(0.0, self._clock.now_s() - since_s))

    def next_s(self) -> float | None:
        """The earliest `until_s` of a live hold (for the controller's timer)."""
        return self._deadlines.next_s()

    def pop_due(self) -> bool:
        """Whether a live hold has run out by now (each is reported once)."""
        return self._deadlines.pop_due(self._clock.now_s()) > 0


class HoldDeadlines:
    """The `until_s` of live holds, earliest first (module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hold, HeldWaiter]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        """Entries kept, stale ones included (a bound on live holds)."""
        return len(self._heap)

    def add(self, waiter: HeldWaiter, hold: Hold) -> None:
        """`waiter` holds `hold` from now on (its earlier hold, if any, becomes stale)."""
        heapq.heappush(self._heap, (hold.until_s, next(self._seq), hold, waiter))

    def next_s(self) -> float | None:
        """The earliest `until_s` of a live hold, None when there is none."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_s: float) -> int:
        """Forget every live hold due by `now_s`; returns how many there were."""
        due = 0
        while (next_s := self.next_s()) is not None and next_s <= now_s:
            heapq.heappop(self._heap)
            due += 1
        return due

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and (heap[0][3].hold is not heap[0][2] or heap[0][3].answered()):
            heapq.heappop(heap)


def live_hold(hold: Hold | None, now_s: float) -> Hold | None:
    """`hold` while its `until_s` is still ahead, else None (an expired hold lets the waiter go)."""
    return hold if hold is not None and now_s < hold.until_s else None
