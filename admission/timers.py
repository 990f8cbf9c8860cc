"""One-shot timers at a `Clock` time: the event loop's in production, a manual one in tests.

The admission controller never polls: it keeps at most one timer, set to the queue's next expiry, and
the tenant gate one timer per held bulkhead lease (its renewal). Both ask a `Timers` for
`call_at(when_s, callback)` where `when_s` is a time on the controller's injected `Clock`.

- `LoopTimers(clock)`: `loop.call_later(max(0, when_s - clock.now_s()), callback)` on the running
  loop. Relative delays make it correct for any clock that advances at wall speed (`SystemClock`);
  asyncio may fire a handle up to one clock resolution early, which callers tolerate (they re-arm).
- `ManualTimers(clock)`: for tests with a `FakeClock`; `advance(delta_s)` moves the clock and runs
  every due callback in deadline order (callbacks scheduled while running that are already due run
  in the same call), so expiry is tested without sleeping.

`EarliestTimer` is the controller's one timer on top of a `Timers`: set to the earliest of deadlines
that keep changing, it is re-armed only when a deadline comes earlier than the one it waits for.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from core.clock import Clock, FakeClock


class TimerHandle(Protocol):
    """What `call_at` returns: the timer can be cancelled (idempotent)."""

    def cancel(self) -> None:
        """Stop the callback from running; a no-op once it ran or was cancelled."""
        ...


class Timers(Protocol):
    """A source of one-shot timers on a `Clock`."""

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback()` once the clock reads ≥ `when_s` (at once when already past)."""
        ...


class LoopTimers:
    """Timers on the running asyncio loop, deadlines read from `clock` (see module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Schedule on `asyncio.get_running_loop()` (call from inside the loop)."""
        delay_s = max(0.0, when_s - self._clock.now_s())
        return asyncio.get_running_loop().call_later(delay_s, callback)


class EarliestTimer:
    """One timer that runs `callback` at the earliest deadline it was armed with.

    `arm(at_s)` with a deadline no earlier than the pending one keeps the pending timer (it fires no
    later than needed; the callback is expected to re-arm for whatever is left), an earlier one
    replaces it, None cancels it. So a stream of later deadlines costs no timer churn."""

    def __init__(self, timers: Timers, callback: Callable[[], None]) -> None:
        self._timers = timers
        self._callback = callback
        self._handle: TimerHandle | None = None
        self._at_s = math.inf

    def arm(self, at_s: float | None) -> None:
        """Fire no later than `at_s` (clock seconds); None: nothing to wait for (cancel)."""
        if at_s is None:
            self.cancel()
            return
        if self._handle is not None and self._at_s <= at_s:
            return
        self.cancel()
        self._handle = self._timers.call_at(at_s, self._fire)
        self._at_s = at_s

    def cancel(self) -> None:
        """No timer pending any more (idempotent)."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._at_s = math.inf

    def _fire(self) -> None:
        self._handle = None
        self._at_s = math.inf
        self._callback()


@dataclass(eq=False, slots=True)
class ManualTimerHandle:
    """A timer of `ManualTimers`."""

    when_s: float
    callback: Callable[[], None]
    cancelled: bool = False
    fired: bool = False

    def cancel(self) -> None:
        """See `TimerHandle.cancel`."""
        self.cancelled = True


class ManualTimers:
    """Timers that fire only inside `advance`/`run_due`, on a `FakeClock` (tests)."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, ManualTimerHandle]] = []
        self._seq = itertools.count()

    @property
    def pending(self) -> int:
        """Timers scheduled and neither fired nor cancelled."""
        return sum(1 for _, _, handle in self._heap if not handle.cancelled)

    def next_when_s(self) -> float | None:
        """Deadline of the earliest pending timer."""
        live = [when_s for when_s, _, handle in self._heap if not handle.cancelled]
        return min(live, default=None)

    def call_at(self, when_s: float, callback: Callable[[], None]) -> ManualTimerHandle:
        """See `Timers.call_at`; nothing runs until `advance` or `run_due`."""
        handle = ManualTimerHandle(when_s, callback)
        heapq.heappush(self._heap, (when_s, next(self._seq), handle))
        return handle

    def run_due(self) -> int:
        """Run every timer due at the clock's current time; returns how many ran."""
        ran = 0
        while self._heap and self._heap[0][0] <= self._clock.now_s():
            _, _, handle = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            handle.fired = True
            handle.callback()
            ran += 1
        return ran

    def advance(self, delta_s: float) -> int:
        """Move the clock forward by `delta_s`, then `run_due()`."""
        self._clock.advance(delta_s)
        return self.run_due()
