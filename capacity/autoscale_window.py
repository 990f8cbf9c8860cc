"""Sliding-window accumulator of what the gateway measures per pool: the autoscaling signal's inputs.

Two windows end at `now`: the *window* (default 60 s) averages the rates the barriers need, and the
*recent* window (one evaluation period, default 15 s) carries the leading signals:

    λ          = arrivals in the window / span                      (req/s)
    λ_recent   = arrivals in the recent window / recent span        (req/s, leads λ)
    ō          = Σ output tokens / completions                      (tokens, window)
    W          = Σ (e2e − queue wait) / completions                 (s, window: time in the engines)
    TTFT p95   = nearest-rank p95 of (ttft − queue wait)            (s, window)
    TPOT p95   = nearest-rank p95 of tpot                           (s, window)
    L_engine   = Σ over ready replicas of their mean `running`      (requests, recent window)
    Q_standing = min of the sampled queue depth                     (requests, recent window)
    Q_trend    = least-squares slope of the sampled depth           (requests/s, recent window)
    wait p95   = nearest-rank p95 of admission queue waits          (s, recent window)

Counts and sums live in buckets of `bucket_s` (1 s, `capacity.window_series`), so memory is bounded by
the window, not the request rate; a bucket is in a window when it *starts* at or after `now − window`,
and the span is `now` minus the start of the oldest such bucket (never more than the time since the
accumulator started), so rates are exact counts over exact spans. Latency samples for the p95 are kept raw but
bounded (`max_samples`: the newest win). The clock is injected: nothing here reads the system time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from capacity.window_series import EPS, BucketSeries, TimedSamples, least_squares_slope, percentile


class Clock(Protocol):
    """Monotonic seconds; structurally `core.clock.Clock` (which `capacity` may not import)."""

    def now_s(self) -> float:
        """Seconds since an arbitrary, fixed origin."""
        ...


@dataclass(frozen=True, slots=True)
class WindowStats:
    """What the window measured at `now_s` (None where there was nothing to measure)."""

    now_s: float
    window_span_s: float
    recent_span_s: float
    arrivals: int
    arrival_rate_per_s: float
    recent_arrival_rate_per_s: float
    completions: int
    mean_output_tokens: float | None
    time_in_system_s: float | None
    ttft_p95_s: float | None
    ttft_samples: int
    tpot_p95_s: float | None
    tpot_samples: int
    ready_replicas: int
    engine_running_requests: float
    max_replica_running_requests: float
    queue_depth_standing: float
    queue_depth_last: float
    queue_trend_per_s: float
    queue_wait_p95_s: float | None
    queue_wait_samples: int


class AutoscaleWindow:
    """Accumulates one pool's observations; `stats()` summarises the windows ending now.

    `window_s` averages λ, ō, W and the latency p95s; `recent_s` (the evaluation period) carries the
    leading signals. A replica is ready while its latest `running` sample is at most `replica_stale_s`
    old (or until `forget_replica`). Latency p95s only count completions observed after the set of
    ready replicas last changed, so a scale-up is judged on what happened after it took effect.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        window_s: float = 60.0,
        recent_s: float = 15.0,
        replica_stale_s: float = 30.0,
        bucket_s: float = 1.0,
        max_samples: int = 10_000,
    ) -> None:
        if not 0 < recent_s <= window_s:
            raise ValueError("need 0 < recent_s <= window_s")
        if bucket_s <= 0 or replica_stale_s <= 0 or max_samples < 1:
            raise ValueError("bucket_s, replica_stale_s and max_samples must be positive")
        self._clock = clock
        self._window_s, self._recent_s = window_s, recent_s
        self._stale_s, self._bucket_s = replica_stale_s, bucket_s
        self._started_s = clock.now_s()
        self._ready_changed_s = self._started_s
        self._arrivals = BucketSeries()
        self._completions = BucketSeries()  # count, Σ output tokens, Σ time in the engines
        self._ttft = TimedSamples(max_samples)
        self._tpot = TimedSamples(max_samples)
        self._queue_depth = TimedSamples(max_samples)
        self._queue_wait = TimedSamples(max_samples)
        self._running: dict[str, TimedSamples] = {}

    @property
    def started_s(self) -> float:
        """Clock time the accumulator was created (the start of its first window)."""
        return self._started_s

    def _index(self, t_s: float) -> int:
        return math.floor(t_s / self._bucket_s + EPS)

    def observe_arrival(self, count: int = 1) -> None:
        """`count` requests arrived for this pool (call at admission, before queueing or shedding)."""
        if count < 0:
            raise ValueError("count must be >= 0")
        self._arrivals.add(self._index(self._clock.now_s()), count)

    def observe_completion(
        self,
        output_tokens: int,
        e2e_s: float,
        *,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        queue_wait_s: float = 0.0,
    ) -> None:
        """A request finished: its output tokens, end-to-end seconds as the client saw them, and when
        known its TTFT, its mean TPOT and how long it waited in the admission queue (subtracted from
        e2e and TTFT: W and the TTFT safety net measure the engines, the queue signal the queue).
        Without `tpot_s`, TPOT is derived as (e2e − ttft) / (tokens − 1) when that is defined."""
        if output_tokens < 0 or e2e_s < 0 or queue_wait_s < 0:
            raise ValueError("output_tokens, e2e_s and queue_wait_s must be >= 0")
        now = self._clock.now_s()
        in_engine_s = max(0.0, e2e_s - queue_wait_s)
        self._completions.add(self._index(now), 1, float(output_tokens), in_engine_s)
        if ttft_s is not None:
            self._ttft.add(now, max(0.0, ttft_s - queue_wait_s))
            if tpot_s is None and output_tokens > 1:
                tpot_s = max(0.0, e2e_s - ttft_s) / (output_tokens - 1)
        if tpot_s is not None:
            self._tpot.add(now, tpot_s)

    def observe_engine_running(self, replica: str, running: float) -> None:
        """The engine on `replica` reports `running` sequences in its batch (from the metrics scraper)."""
        if running < 0:
            raise ValueError("running must be >= 0")
        now = self._clock.now_s()
        samples = self._running.get(replica)
        if samples is None or not self._is_fresh(samples, now):
            self._ready_changed_s = now
        if samples is None:
            samples = self._running[replica] = TimedSamples(1024)
        samples.add(now, running)

    def forget_replica(self, replica: str) -> None:
        """`replica` left the pool (removed, drained or marked down): stop counting it as ready."""
        if self._running.pop(replica, None) is not None:
            self._ready_changed_s = self._clock.now_s()

    def observe_queue_depth(self, depth: int) -> None:
        """Requests waiting in admission for this pool; sample periodically (every scrape tick)."""
        if depth < 0:
            raise ValueError("depth must be >= 0")
        self._queue_depth.add(self._clock.now_s(), depth)

    def observe_queue_wait(self, wait_s: float) -> None:
        """A request left the admission queue (granted, timed out or shed) after `wait_s` seconds."""
        if wait_s < 0:
            raise ValueError("wait_s must be >= 0")
        self._queue_wait.add(self._clock.now_s(), wait_s)

    def _is_fresh(self, samples: TimedSamples, now_s: float) -> bool:
        last = samples.last()
        return last is not None and now_s - last[0] <= self._stale_s

    def _first_index_and_span(self, now_s: float, length_s: float) -> tuple[int, float]:
        first = math.ceil((now_s - length_s) / self._bucket_s - EPS)
        start = max(first * self._bucket_s, self._started_s)
        return first, max(0.0, now_s - start)

    def _evict(self, now_s: float) -> None:
        first, _ = self._first_index_and_span(now_s, self._window_s)
        self._arrivals.evict_before(first)
        self._completions.evict_before(first)
        horizon = now_s - self._window_s
        for series in (self._ttft, self._tpot, self._queue_depth, self._queue_wait):
            series.evict_before(horizon)
        for replica in [r for r, s in self._running.items() if not self._is_fresh(s, now_s)]:
            del self._running[replica]
            self._ready_changed_s = now_s

    def stats(self) -> WindowStats:
        """Summarise both windows at the clock's current time (evicting what fell out of the window)."""
        now = self._clock.now_s()
        self._evict(now)
        first, span = self._first_index_and_span(now, self._window_s)
        recent_first, recent_span = self._first_index_and_span(now, self._recent_s)
        arrivals, _, _ = self._arrivals.totals(first)
        recent_arrivals, _, _ = self._arrivals.totals(recent_first)
        done, tokens, in_engine_s = self._completions.totals(first)
        latency_from = max(now - self._window_s, self._ready_changed_s)
        ttft = [v for _, v in self._ttft.since(latency_from)]
        tpot = [v for _, v in self._tpot.since(latency_from)]
        running = self._replica_running(now)
        depth_points = self._queue_depth.since(now - self._recent_s)
        last_depth = self._queue_depth.last()
        last = last_depth[1] if last_depth is not None else 0.0
        waits = [v for _, v in self._queue_wait.since(now - self._recent_s)]
        return WindowStats(
            now_s=now,
            window_span_s=span,
            recent_span_s=recent_span,
            arrivals=int(arrivals),
            arrival_rate_per_s=arrivals / span if span > 0 else 0.0,
            recent_arrival_rate_per_s=recent_arrivals / recent_span if recent_span > 0 else 0.0,
            completions=int(done),
            mean_output_tokens=tokens / done if done else None,
            time_in_system_s=in_engine_s / done if done else None,
            ttft_p95_s=percentile(ttft, 0.95),
            ttft_samples=len(ttft),
            tpot_p95_s=percentile(tpot, 0.95),
            tpot_samples=len(tpot),
            ready_replicas=len(running),
            engine_running_requests=sum(running),
            max_replica_running_requests=max(running, default=0.0),
            queue_depth_standing=min((v for _, v in depth_points), default=last),
            queue_depth_last=last,
            queue_trend_per_s=least_squares_slope(depth_points),
            queue_wait_p95_s=percentile(waits, 0.95),
            queue_wait_samples=len(waits),
        )

    def _replica_running(self, now_s: float) -> list[float]:
        """Per ready replica: mean `running` over the recent window, else its latest sample."""
        means: list[float] = []
        for samples in self._running.values():
            recent = [v for _, v in samples.since(now_s - self._recent_s)]
            if recent:
                means.append(sum(recent) / len(recent))
            else:
                last = samples.last()
                means.append(last[1] if last is not None else 0.0)
        return means
