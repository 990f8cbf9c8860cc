"""Tenant rate limits: the token-bucket algorithm, its result values, and the in-memory store.

The algorithm is pure (`bucket_level`, `take_all`, `adjust_level`) and separate from where bucket
state lives: `MemoryRateLimitStore` keeps it in a dict on an injected clock; `RedisRateLimitStore`
(`core.shared_state`) runs the same arithmetic inside one atomic Lua script. Both satisfy
`RateLimitStore`, so the gateway is wired once and picks a backend from `state.backend`.

Token bucket (per tenant, one bucket per `LimitKind`):

    level(t)  = min(capacity, level(t0) + (t - t0) · refill_per_s)      (absent bucket = full)
    cost'     = min(cost, capacity)    a request bigger than the burst waits for a full bucket
    allowed   ⇔ level(t) ≥ cost' for EVERY bucket (all-or-nothing: a request refused by its token
                bucket does not spend a request token)
    allowed → level := level - cost';  refused → nothing changes
    retry_after_s = max over short buckets of (cost' - level) / refill_per_s
    reset_s       = max over buckets of (capacity - level_after) / refill_per_s   (until full again)

Requests/min and tokens/min limits are buckets with `refill_per_s = limit / 60` and, by default,
`capacity = limit` (a fresh tenant may spend its minute's quota at once; over any window T a tenant
gets at most capacity + refill_per_s · T). `reconcile(delta)` charges `actual - estimated` tokens after
the response: positive deltas may push the level into debt (floored at -capacity, which bounds how long
a tenant can be locked out by one underestimate), negative deltas refund up to capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from admission.outcomes import RejectReason
from core.clock import Clock

SECONDS_PER_MINUTE = 60.0
LEVEL_EPSILON = 1e-9  # float slack so a bucket refilled to exactly the cost admits it (same in Lua)


class LimitKind(StrEnum):
    """Which quota a bucket counts (a metric label and the suffix of `x-ratelimit-*` headers)."""

    REQUESTS = "requests"
    TOKENS = "tokens"


@dataclass(frozen=True, slots=True)
class TokenBucketLimit:
    """A bucket of `capacity` units (the burst) refilled at `refill_per_s` units per second."""

    capacity: float
    refill_per_s: float

    def __post_init__(self) -> None:
        if self.capacity <= 0 or self.refill_per_s <= 0:
            raise ValueError(f"capacity and refill_per_s must be > 0 (got {self})")

    @classmethod
    def per_minute(cls, limit_per_min: float, burst: float | None = None) -> TokenBucketLimit:
        """`limit_per_min` per minute; burst defaults to the whole minute's quota."""
        return cls(
            capacity=limit_per_min if burst is None else burst,
            refill_per_s=limit_per_min / SECONDS_PER_MINUTE,
        )


@dataclass(frozen=True, slots=True)
class TenantRateLimits:
    """A tenant's limits; None means unlimited for that kind."""

    requests: TokenBucketLimit | None = None
    tokens: TokenBucketLimit | None = None

    def costs(self, estimated_tokens: int) -> list[tuple[LimitKind, TokenBucketLimit, float]]:
        """The buckets a request touches with its cost in each: 1 request, `estimated_tokens` tokens."""
        wanted: list[tuple[LimitKind, TokenBucketLimit, float]] = []
        if self.requests is not None:
            wanted.append((LimitKind.REQUESTS, self.requests, 1.0))
        if self.tokens is not None:
            wanted.append((LimitKind.TOKENS, self.tokens, float(max(estimated_tokens, 0))))
        return wanted


@dataclass(frozen=True, slots=True)
class BucketReading:
    """One bucket after a decision: units left, seconds until full, seconds until the cost fits."""

    kind: LimitKind
    remaining: float
    reset_s: float
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class RateLimitResult:
    """Decision of `acquire`. `degraded` marks a decision taken by the `FailureMode` because the
    backend was unreachable (then `buckets` is empty). `retry_after_s` is 0 when allowed."""

    allowed: bool
    retry_after_s: float = 0.0
    reset_s: float = 0.0
    buckets: tuple[BucketReading, ...] = ()
    degraded: bool = False

    @property
    def reason(self) -> RejectReason | None:
        """`RATE_LIMITED` when refused, else None."""
        return None if self.allowed else RejectReason.RATE_LIMITED

    @property
    def limited_by(self) -> LimitKind | None:
        """The bucket that needs the longest wait when refused."""
        short = [b for b in self.buckets if b.retry_after_s > 0]
        return max(short, key=lambda b: b.retry_after_s).kind if short else None

    def remaining(self, kind: LimitKind) -> float | None:
        """Units left in bucket `kind` (None when that kind is not limited or the result is degraded)."""
        return next((b.remaining for b in self.buckets if b.kind is kind), None)

    @classmethod
    def from_readings(cls, allowed: bool, readings: Sequence[BucketReading]) -> RateLimitResult:
        """Fold per-bucket readings into one result (max reset; max retry-after when refused)."""
        retry_after_s = 0.0 if allowed else max((b.retry_after_s for b in readings), default=0.0)
        reset_s = max((b.reset_s for b in readings), default=0.0)
        return cls(allowed=allowed, retry_after_s=retry_after_s, reset_s=reset_s, buckets=tuple(readings))


@dataclass(frozen=True, slots=True)
class BucketState:
    """Stored state of one bucket: its level at `updated_s`."""

    level: float
    updated_s: float


def bucket_level(state: BucketState | None, limit: TokenBucketLimit, now_s: float) -> float:
    """The bucket's level at `now_s` after refill (an absent bucket is full)."""
    if state is None:
        return limit.capacity
    elapsed_s = max(0.0, now_s - state.updated_s)
    return min(limit.capacity, state.level + elapsed_s * limit.refill_per_s)


def take_all(
    states: Sequence[BucketState | None],
    wanted: Sequence[tuple[LimitKind, TokenBucketLimit, float]],
    now_s: float,
) -> tuple[bool, list[BucketState | None], list[BucketReading]]:
    """All-or-nothing take across buckets; returns (allowed, new states, readings). Pure."""
    levels = [bucket_level(state, limit, now_s) for state, (_, limit, _) in zip(states, wanted, strict=True)]
    costs = [min(cost, limit.capacity) for _, limit, cost in wanted]
    allowed = all(level + LEVEL_EPSILON >= cost for level, cost in zip(levels, costs, strict=True))
    new_states: list[BucketState | None] = list(states)
    readings: list[BucketReading] = []
    for i, ((kind, limit, _), level, cost) in enumerate(zip(wanted, levels, costs, strict=True)):
        remaining = level - cost if allowed else level
        retry_after_s = 0.0 if allowed else max(0.0, cost - level) / limit.refill_per_s
        reset_s = (limit.capacity - remaining) / limit.refill_per_s
        readings.append(BucketReading(kind, remaining, reset_s, retry_after_s))
        if allowed:
            new_states[i] = BucketState(level=remaining, updated_s=now_s)
    return allowed, new_states, readings


def adjust_level(
    state: BucketState | None, limit: TokenBucketLimit, delta: float, now_s: float
) -> BucketState:
    """Charge `delta` more units (refund when negative); level kept within [-capacity, capacity]."""
    level = bucket_level(state, limit, now_s) - delta
    return BucketState(level=max(-limit.capacity, min(limit.capacity, level)), updated_s=now_s)


class RateLimitStore(Protocol):
    """What the gateway calls; implemented in memory and in Redis."""

    async def acquire(self, tenant: str, limits: TenantRateLimits, estimated_tokens: int) -> RateLimitResult:
        """Take 1 request and `estimated_tokens` tokens from `tenant`'s buckets, all or nothing."""
        ...

    async def reconcile(self, tenant: str, limits: TenantRateLimits, delta_tokens: int) -> None:
        """After the response: charge `actual - estimated` tokens (negative refunds)."""
        ...


class MemoryRateLimitStore:
    """Buckets in a dict keyed by (tenant, kind); one process only. State per configured tenant."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._states: dict[tuple[str, LimitKind], BucketState] = {}

    async def acquire(self, tenant: str, limits: TenantRateLimits, estimated_tokens: int) -> RateLimitResult:
        """See `RateLimitStore.acquire`. Atomic: no await between read and write."""
        wanted = limits.costs(estimated_tokens)
        if not wanted:
            return RateLimitResult(allowed=True)
        keys = [(tenant, kind) for kind, _, _ in wanted]
        allowed, new_states, readings = take_all(
            [self._states.get(key) for key in keys], wanted, self._clock.now_s()
        )
        for key, state in zip(keys, new_states, strict=True):
            if state is not None:
                self._states[key] = state
        return RateLimitResult.from_readings(allowed, readings)

    async def reconcile(self, tenant: str, limits: TenantRateLimits, delta_tokens: int) -> None:
        """See `RateLimitStore.reconcile`; a no-op when tokens are unlimited or the delta is 0."""
        if limits.tokens is None or delta_tokens == 0:
            return
        key = (tenant, LimitKind.TOKENS)
        self._states[key] = adjust_level(
            self._states.get(key), limits.tokens, delta_tokens, self._clock.now_s()
        )
