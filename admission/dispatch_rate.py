"""Measured dispatch rate (requests leaving the queue for a replica per second), exponentially decayed.

Each dispatch at time t_i contributes weight exp(-(t - t_i)/τ), so the decayed count is

    C(t) = Σ_i exp(-(t - t_i)/τ)              (updated in O(1) per event)

and the rate is C divided by the weight an observation window of age `a` can hold:

    rate(t) = C(t) / (τ · (1 - exp(-max(a, w_min)/τ)))     a = t - meter start

At a steady rate r, C → r·τ and rate → r; early on (a ≪ τ) the normaliser shrinks so the estimate is not
biased low, and `w_min` (default 1 s) stops a burst of two dispatches in a millisecond from reading as a
thousand per second. τ defaults to 10 s: long enough to smooth the batching rhythm of an engine, short
enough that Retry-After follows a change of fleet size within a few tens of seconds.

`rate_per_s()` is None until the first dispatch is recorded (the caller then uses its fallback, see
`retry_after.queue_retry_after_s`); after that it is a float that decays towards 0 while nothing is
dispatched, which is the honest reading of a stalled queue.
"""

from __future__ import annotations

import math

from core.clock import Clock

DEFAULT_TIME_CONSTANT_S = 10.0
DEFAULT_MIN_WINDOW_S = 1.0


class DispatchRateMeter:
    """Exponentially decayed rate of `record()` calls per second on an injected clock."""

    def __init__(
        self,
        clock: Clock,
        time_constant_s: float = DEFAULT_TIME_CONSTANT_S,
        min_window_s: float = DEFAULT_MIN_WINDOW_S,
    ) -> None:
        if time_constant_s <= 0 or min_window_s <= 0:
            raise ValueError("time_constant_s and min_window_s must be > 0")
        self._clock = clock
        self._tau_s = time_constant_s
        self._min_window_s = min_window_s
        self._started_s = clock.now_s()
        self._decayed_count = 0.0
        self._updated_s = self._started_s
        self._total = 0

    @property
    def dispatched_total(self) -> int:
        """All dispatches ever recorded (a counter for metrics)."""
        return self._total

    def record(self, count: int = 1) -> None:
        """Count `count` dispatches now."""
        if count < 0:
            raise ValueError(f"count must be ≥ 0 (got {count})")
        now_s = self._clock.now_s()
        self._decayed_count = self._decayed_at(now_s) + count
        self._updated_s = now_s
        self._total += count

    def rate_per_s(self) -> float | None:
        """Dispatches per second by the formula above; None when nothing was ever dispatched."""
        if self._total == 0:
            return None
        now_s = self._clock.now_s()
        window_s = max(now_s - self._started_s, self._min_window_s)
        return self._decayed_at(now_s) / (self._tau_s * -math.expm1(-window_s / self._tau_s))

    def _decayed_at(self, now_s: float) -> float:
        return self._decayed_count * math.exp(-max(0.0, now_s - self._updated_s) / self._tau_s)
