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

`PoolRates` is what the admission controller divides by: one meter for the pool and one per class,
one meter of arrivals per class (requests that asked for a slot, admitted or refused), and the capacity
the release forecast implies, C = held tickets ÷ mean hold time. Besides, a recent meter per class
(τ = `RECENT_TIME_CONSTANT_S`, 2 s) of its dispatches from the queue says how fast waiters of the
classes below one were given slots just now (`below_per_s`): slots an arrival of that class would
have been given first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from admission.release_forecast import ReleaseForecast
from core.clock import Clock

DEFAULT_TIME_CONSTANT_S = 10.0
DEFAULT_MIN_WINDOW_S = 1.0
RECENT_TIME_CONSTANT_S = 2.0
"""The time constant of the recent per-class dispatch meters (`PoolRates.below_per_s`): about a TTFT
objective's queue budget, so what they saw still says something about the next such budget."""


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


class PoolRates:
    """A pool's dispatch rates: measured in total and per class (highest first), and its capacity."""

    def __init__(self, clock: Clock, class_names: Sequence[str], forecast: ReleaseForecast) -> None:
        self._names = tuple(class_names)
        self._meter = DispatchRateMeter(clock)
        self._class_meters = {name: DispatchRateMeter(clock) for name in self._names}
        self._recent_meters = {name: DispatchRateMeter(clock, RECENT_TIME_CONSTANT_S) for name in self._names}
        self._arrival_meters = {name: DispatchRateMeter(clock) for name in self._names}
        self._forecast = forecast

    def record(self, class_name: str, queued: bool = False) -> None:
        """One dispatch of class `class_name` now (`queued`: of a waiter, not on the fast path)."""
        self._meter.record()
        self._class_meters[class_name].record()
        if queued:
            self._recent_meters[class_name].record()

    def arrived(self, class_name: str) -> None:
        """A request of class `class_name` asked for a slot now (whatever its answer)."""
        self._arrival_meters[class_name].record()

    def rate_per_s(self) -> float | None:
        """Measured dispatches per second of every class (None before the first)."""
        return self._meter.rate_per_s()

    def above_per_s(self, class_name: str) -> float:
        """λ_above: the demand of the classes strictly above `class_name` (0 for the highest class,
        exactly) — their arrivals per second, refused ones included, and at least their dispatches. Not
        their dispatches alone: past the knee the classes above are refused at arrival too, and a lower
        class that counted only what they were served would take the slots their refused arrivals
        needed (priority inverted); counting their demand, a lower class yields first."""
        above = self._names[: self._names.index(class_name)]
        return sum(
            max(self._arrival_meters[name].rate_per_s() or 0.0, self._class_meters[name].rate_per_s() or 0.0)
            for name in above
        )

    def below_per_s(self, class_name: str) -> float:
        """Waiters of the classes strictly below `class_name` dispatched per second over the last
        seconds (the recent meters, τ = `RECENT_TIME_CONSTANT_S`); 0 for the lowest class. The queue
        serves the higher classes first, so each is a slot a waiter of `class_name` would have taken:
        openings the release forecast may not see (a learned cap growing in an onset). Waiters only:
        a fast-path dispatch took a slot that was free at its arrival, as the pool filled, which says
        nothing about the slots that open once it is full."""
        below = self._names[self._names.index(class_name) + 1 :]
        return sum(self._recent_meters[name].rate_per_s() or 0.0 for name in below)

    def capacity_per_s(self) -> float | None:
        """C: dispatches per second the pool sustains while full — held tickets ÷ mean hold time; None
        before a ticket has been released or while none is held (no evidence)."""
        mean_hold_s = self._forecast.mean_hold_s
        if mean_hold_s is None or mean_hold_s <= 0 or not len(self._forecast):
            return None
        return len(self._forecast) / mean_hold_s

    def available_per_s(self, class_name: str) -> float | None:
        """C − λ_above (≥ 0): the dispatches per second left to class `class_name` and those below it
        while the pool is full (C: the measured rate until a ticket has been released); None before
        any dispatch. The rate of Retry-After estimates."""
        capacity = self.capacity_per_s() or self._meter.rate_per_s()
        if capacity is None:
            return None
        return max(0.0, capacity - self.above_per_s(class_name))
