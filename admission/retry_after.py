"""Retry-After values: integer seconds ≥ 1, always computed from the state that caused the refusal.

Every function returns `clamp(ceil(estimate_s), 1, max_s)`; `max_s` defaults to 120 s
(`DEFAULT_MAX_RETRY_AFTER_S`): beyond two minutes a client should re-plan rather than sleep, and load
balancers and SDKs commonly cap their own back-off near there. NaN or infinite estimates become `max_s`.

| refusal                  | estimate                                                              |
|--------------------------|-----------------------------------------------------------------------|
| queue_full/queue_timeout | Little's law: ahead ÷ measured dispatch rate, bounded by the drain bound |
| rate_limited             | time until the bucket holds the request's cost (`RateLimitResult`)    |
| tenant bulkhead full     | mean service time ÷ requests in use (first of n to finish)            |
| no_replica               | soonest of: next health probe, next breaker half-open                 |
| draining                 | time for load balancers to see this instance not ready               |
"""

from __future__ import annotations

import math
from collections.abc import Iterable

DEFAULT_MAX_RETRY_AFTER_S = 120
MIN_RETRY_AFTER_S = 1


def clamp_retry_after_s(estimate_s: float, max_s: int = DEFAULT_MAX_RETRY_AFTER_S) -> int:
    """`ceil(estimate_s)` clamped to [1, max_s]; NaN and ±inf map to `max_s`."""
    if max_s < MIN_RETRY_AFTER_S:
        raise ValueError(f"max_s must be ≥ {MIN_RETRY_AFTER_S} (got {max_s})")
    if math.isnan(estimate_s) or math.isinf(estimate_s):
        return max_s
    return max(MIN_RETRY_AFTER_S, min(max_s, math.ceil(estimate_s)))


def queue_retry_after_s(
    ahead: int,
    dispatch_rate_per_s: float | None,
    drain_bound_s: float | None = None,
    max_s: int = DEFAULT_MAX_RETRY_AFTER_S,
) -> int:
    """Estimated drain time of the queue ahead of a refused (or timed-out) request.

    With a measured rate λ > 0: `ahead / λ` (Little's law, W = L / λ), capped by `drain_bound_s` when
    given. Fallback when no rate is measured yet (None or 0): `drain_bound_s` — the time by which every
    entry now ahead has left the queue, by dispatch or by timing out (`PriorityQueue.drain_bound_s`),
    which needs no rate; `max_s` when that is unknown too.
    """
    if dispatch_rate_per_s is not None and dispatch_rate_per_s > 0:
        estimate_s = ahead / dispatch_rate_per_s
        if drain_bound_s is not None:
            estimate_s = min(estimate_s, drain_bound_s)
    elif drain_bound_s is not None:
        estimate_s = drain_bound_s
    else:
        estimate_s = math.inf
    return clamp_retry_after_s(estimate_s, max_s)


def rate_limit_retry_after_s(refill_wait_s: float, max_s: int = DEFAULT_MAX_RETRY_AFTER_S) -> int:
    """Time until the limiting bucket has refilled enough (`RateLimitResult.retry_after_s`)."""
    return clamp_retry_after_s(refill_wait_s, max_s)


def concurrency_retry_after_s(
    in_use: int, mean_service_s: float, max_s: int = DEFAULT_MAX_RETRY_AFTER_S
) -> int:
    """Bulkhead full: expected wait for the first of `in_use` running requests to finish, assuming
    memoryless service times (the minimum of n exponentials with mean S has mean S / n)."""
    return clamp_retry_after_s(mean_service_s / max(in_use, 1), max_s)


def no_replica_retry_after_s(timers_s: Iterable[float | None], max_s: int = DEFAULT_MAX_RETRY_AFTER_S) -> int:
    """Soonest of the timers that can bring a replica back (seconds from now: next health probe,
    breaker half-open, next discovery refresh). No timer at all means nothing will change by itself:
    `max_s`."""
    known = [timer_s for timer_s in timers_s if timer_s is not None]
    return clamp_retry_after_s(min(known, default=math.inf), max_s)


def draining_retry_after_s(readiness_propagation_s: float, max_s: int = DEFAULT_MAX_RETRY_AFTER_S) -> int:
    """Draining: how long until load balancers stop sending here (readiness period x failure
    threshold), after which a retry lands on another instance."""
    return clamp_retry_after_s(readiness_propagation_s, max_s)
