"""Time series for sliding windows, bounded in memory, and the statistics taken over them.

- `BucketSeries`: a count and two sums per time bucket (an integer index), oldest first, so a window's
  totals are exact and memory is O(window / bucket) whatever the event rate;
- `TimedSamples`: raw (time, value) samples, newest last, bounded in number (the newest win);
- `percentile`: nearest rank, the ⌈q·n⌉-th smallest value; `least_squares_slope`: the slope of the
  least-squares line through (t, y) points, 0 without two distinct times.
"""

from __future__ import annotations

import math
from collections import deque

EPS = 1e-9
"""Slack for float rounding at bucket and rank boundaries."""


def percentile(values: list[float], quantile: float) -> float | None:
    """Nearest-rank quantile: the ⌈q·n⌉-th smallest value (p95 of 1..20 is 19); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(quantile * len(ordered) - EPS))
    return ordered[rank - 1]


def least_squares_slope(points: list[tuple[float, float]]) -> float:
    """Slope of the least-squares line through (t, y) points; 0 with fewer than two distinct times."""
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    if var_t <= 0:
        return 0.0
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var_t


class _Bucket:
    __slots__ = ("count", "index", "sum_a", "sum_b")

    def __init__(self, index: int) -> None:
        self.index = index
        self.count = 0.0
        self.sum_a = 0.0
        self.sum_b = 0.0


class BucketSeries:
    """Per-bucket count and two sums, so a window total is exact and memory is O(window / bucket)."""

    def __init__(self) -> None:
        self._buckets: deque[_Bucket] = deque()

    def add(self, index: int, count: float, a: float = 0.0, b: float = 0.0) -> None:
        if not self._buckets or self._buckets[-1].index < index:
            self._buckets.append(_Bucket(index))
        bucket = self._buckets[-1]
        bucket.count += count
        bucket.sum_a += a
        bucket.sum_b += b

    def evict_before(self, index: int) -> None:
        while self._buckets and self._buckets[0].index < index:
            self._buckets.popleft()

    def totals(self, first_index: int) -> tuple[float, float, float]:
        count = sum_a = sum_b = 0.0
        for bucket in reversed(self._buckets):
            if bucket.index < first_index:
                break
            count += bucket.count
            sum_a += bucket.sum_a
            sum_b += bucket.sum_b
        return count, sum_a, sum_b


class TimedSamples:
    """(time, value) samples, newest last, bounded in number."""

    def __init__(self, max_samples: int) -> None:
        self._items: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now_s: float, value: float) -> None:
        self._items.append((now_s, value))

    def evict_before(self, t_s: float) -> None:
        while self._items and self._items[0][0] < t_s:
            self._items.popleft()

    def since(self, t_s: float) -> list[tuple[float, float]]:
        return [(t, v) for t, v in self._items if t >= t_s]

    def last(self) -> tuple[float, float] | None:
        return self._items[-1] if self._items else None
