"""Retry budget: retries may add at most a fraction of traffic, so retries cannot snowball an overload.

Over a sliding window of `window_s` seconds (default 10 s, kept as `bucket_count` buckets, default 10):

    allowed retries = budget_ratio · first_attempts_in_window + min_retries_per_s · window_s
    try_spend()     ⇔ retries_in_window + 1 ≤ allowed retries (then the retry is counted)

`budget_ratio` defaults to 0.1 (DESIGN §4 `retries.budget_ratio`); the floor `min_retries_per_s`
(default 0.5, i.e. 5 retries per 10 s window) lets a quiet service still retry an occasional failure.
Only first attempts count as requests (`record_request`); a retry is counted only when it is allowed, so
refused retries do not eat the budget. The window slides by whole buckets (granularity
`window_s / bucket_count`); memory is O(bucket_count).
"""

from __future__ import annotations

import math

from core.clock import Clock

DEFAULT_BUDGET_RATIO = 0.1
DEFAULT_MIN_RETRIES_PER_S = 0.5
DEFAULT_WINDOW_S = 10.0
DEFAULT_BUCKET_COUNT = 10


class RetryBudget:
    """Sliding-window retry budget on an injected clock."""

    def __init__(
        self,
        clock: Clock,
        budget_ratio: float = DEFAULT_BUDGET_RATIO,
        min_retries_per_s: float = DEFAULT_MIN_RETRIES_PER_S,
        window_s: float = DEFAULT_WINDOW_S,
        bucket_count: int = DEFAULT_BUCKET_COUNT,
    ) -> None:
        if budget_ratio < 0 or min_retries_per_s < 0:
            raise ValueError("budget_ratio and min_retries_per_s must be ≥ 0")
        if window_s <= 0 or bucket_count < 1:
            raise ValueError("window_s must be > 0 and bucket_count ≥ 1")
        self._clock = clock
        self._budget_ratio = budget_ratio
        self._floor_retries = min_retries_per_s * window_s
        self._bucket_s = window_s / bucket_count
        self._requests = [0] * bucket_count
        self._retries = [0] * bucket_count
        self._current_index = self._index_at(clock.now_s())
        self._refused_total = 0

    @property
    def refused_total(self) -> int:
        """Retries refused since start (a counter for metrics)."""
        return self._refused_total

    def record_request(self, count: int = 1) -> None:
        """Count first attempts (not retries)."""
        self._requests[self._slot()] += count

    def available(self) -> int:
        """Retries that `try_spend` would allow right now."""
        self._slot()
        allowed = self._budget_ratio * sum(self._requests) + self._floor_retries
        return max(0, math.floor(allowed + 1e-9) - sum(self._retries))

    def try_spend(self) -> bool:
        """Count one retry and return True if the budget allows it; else count a refusal, return False."""
        if self.available() < 1:
            self._refused_total += 1
            return False
        self._retries[self._slot()] += 1
        return True

    def _index_at(self, now_s: float) -> int:
        return math.floor(now_s / self._bucket_s)

    def _slot(self) -> int:
        """Advance the window to now (zeroing buckets that slid out) and return the current slot."""
        index = self._index_at(self._clock.now_s())
        size = len(self._requests)
        for stale in range(max(self._current_index + 1, index - size + 1), index + 1):
            self._requests[stale % size] = 0
            self._retries[stale % size] = 0
        self._current_index = max(self._current_index, index)
        return self._current_index % size
