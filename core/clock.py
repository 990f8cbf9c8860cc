"""Injected time for admission control: a `Clock` protocol, the system clock and a fake one for tests.

Every structure in `admission` reads time through a `Clock` so that queues, buckets, meters and budgets
are tested by advancing a `FakeClock` by hand, without sleeping. `now_s()` is monotonic seconds with an
arbitrary origin: only differences are meaningful, and values from two processes are not comparable
(which is why the Redis scripts use the Redis server's `TIME`, see `core.shared_state`).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A monotonic source of seconds (float). Never goes backwards."""

    def now_s(self) -> float:
        """Seconds since an arbitrary, fixed origin."""
        ...


class SystemClock:
    """`time.monotonic()`: the same clock asyncio's event loop uses for its timers by default."""

    def now_s(self) -> float:
        """Monotonic seconds from the OS."""
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to (`advance`, `set`), for deterministic tests."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        """The current fake time."""
        return self._now_s

    def advance(self, delta_s: float) -> float:
        """Move time forward by `delta_s` (≥ 0) and return the new time; negative deltas raise ValueError."""
        if delta_s < 0:
            raise ValueError(f"a monotonic clock cannot go back (delta_s={delta_s})")
        self._now_s += delta_s
        return self._now_s

    def set(self, now_s: float) -> None:
        """Jump to `now_s`, which must not be earlier than the current time."""
        self.advance(now_s - self._now_s)
