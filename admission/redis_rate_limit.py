"""The token-bucket rate-limit store on Redis: the arithmetic of `admission.rate_limit` in two Lua scripts.

Each acquire is ONE atomic script across a tenant's buckets (requests and tokens), so concurrent
gateway instances never lose an update; time is the Redis server's (see `core.shared_state`). While
Redis is unreachable the backend's failure mode answers: `fail_open` allows (marked `degraded`, no
tokens charged), `fail_closed` refuses with the outage's Retry-After.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from admission.rate_limit import (
    LEVEL_EPSILON,
    BucketReading,
    LimitKind,
    RateLimitResult,
    TenantRateLimits,
    TokenBucketLimit,
)
from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation

BUCKET_LEVEL_LUA = """
-- A token bucket's level now: its stored level refilled at `rate` per second since it was updated,
-- at most `cap`; a bucket never written is full.
local function bucket_level(key, cap, rate, now)
  local state = redis.call('HMGET', key, 'level', 'updated_s')
  if not state[1] then return cap end
  return math.min(cap, tonumber(state[1]) + math.max(0, now - tonumber(state[2])) * rate)
end
-- Store a bucket's new level, expiring when it would have refilled to `cap` (plus a second).
local function bucket_store(key, cap, rate, level, now)
  redis.call('HSET', key, 'level', fmt(level), 'updated_s', fmt(now))
  redis.call('PEXPIRE', key, math.ceil((cap - level) / rate * 1000) + 1000)
end
-- Append a bucket's reading to a script's answer: level left, seconds until full, seconds to wait
-- (`bucket_readings` parses the triples).
local function bucket_reading(out, cap, rate, remaining, retry)
  out[#out + 1] = fmt(remaining)
  out[#out + 1] = fmt((cap - remaining) / rate)
  out[#out + 1] = fmt(retry)
end
"""

_RATE_ACQUIRE_LUA = (
    LUA_PRELUDE
    + BUCKET_LEVEL_LUA
    + """
-- KEYS: buckets. ARGV: now|'', epsilon, then per bucket i:
--   ARGV[3i] capacity, ARGV[3i+1] refill/s, ARGV[3i+2] cost
local now, eps = now_s(), tonumber(ARGV[2])
local levels, caps, rates, costs = {}, {}, {}, {}
local allowed = 1
for i = 1, #KEYS do
  caps[i], rates[i] = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  costs[i] = math.min(tonumber(ARGV[3 * i + 2]), caps[i])
  levels[i] = bucket_level(KEYS[i], caps[i], rates[i], now)
  if levels[i] + eps < costs[i] then allowed = 0 end
end
local out = {allowed}
for i = 1, #KEYS do
  local remaining, retry = levels[i], 0
  if allowed == 1 then
    remaining = levels[i] - costs[i]
    bucket_store(KEYS[i], caps[i], rates[i], remaining, now)
  else
    retry = math.max(0, costs[i] - levels[i]) / rates[i]
  end
  bucket_reading(out, caps[i], rates[i], remaining, retry)
end
return out
"""
)

_RATE_ADJUST_LUA = (
    LUA_PRELUDE
    + BUCKET_LEVEL_LUA
    + """
-- KEYS[1]: bucket. ARGV: now|'', capacity, refill/s, delta (charged; negative refunds)
local now = now_s()
local cap, rate, delta = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local level = math.max(-cap, math.min(cap, bucket_level(KEYS[1], cap, rate, now) - delta))
bucket_store(KEYS[1], cap, rate, level, now)
return fmt(level)
"""
)


def bucket_readings(
    wanted: Sequence[tuple[LimitKind, TokenBucketLimit, float]], reply: Sequence[Any], first: int
) -> list[BucketReading]:
    """The per-bucket (remaining, reset_s, retry_s) triples a bucket script returns from `reply[first]`
    on, one per bucket of `wanted` (`TenantRateLimits.costs`), in order."""
    return [
        BucketReading(
            kind,
            float(reply[first + 3 * i]),
            float(reply[first + 1 + 3 * i]),
            float(reply[first + 2 + 3 * i]),
        )
        for i, (kind, _, _) in enumerate(wanted)
    ]


class RedisRateLimitStore:
    """`RateLimitStore` over Redis: buckets are hashes `{prefix}rl:{tenant}:{kind}` (fields `level`,
    `updated_s`) that expire once they would be full again (an absent bucket is full)."""

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._acquire = backend.register(_RATE_ACQUIRE_LUA)
        self._adjust = backend.register(_RATE_ADJUST_LUA)

    async def acquire(self, tenant: str, limits: TenantRateLimits, estimated_tokens: int) -> RateLimitResult:
        """See `RateLimitStore.acquire`; one atomic script across the tenant's buckets."""
        wanted = limits.costs(estimated_tokens)
        if not wanted:
            return RateLimitResult(allowed=True)
        args: list[Any] = [repr(LEVEL_EPSILON)]
        for _, limit, cost in wanted:
            args += [repr(limit.capacity), repr(limit.refill_per_s), repr(cost)]
        keys = [self.key(tenant, kind) for kind, _, _ in wanted]
        reply = await self._backend.run(RedisOperation.RATE_LIMIT_ACQUIRE, self._acquire, keys, args)
        if reply is None:
            return self.degraded()
        return RateLimitResult.from_readings(int(reply[0]) == 1, bucket_readings(wanted, reply, first=1))

    async def reconcile(self, tenant: str, limits: TenantRateLimits, delta_tokens: int) -> None:
        """See `RateLimitStore.reconcile`; skipped (counted) while Redis is unreachable."""
        if limits.tokens is None or delta_tokens == 0:
            return
        args = [repr(limits.tokens.capacity), repr(limits.tokens.refill_per_s), str(delta_tokens)]
        key = self.key(tenant, LimitKind.TOKENS)
        await self._backend.run(RedisOperation.RATE_LIMIT_RECONCILE, self._adjust, [key], args)

    def key(self, tenant: str, kind: LimitKind) -> str:
        """A tenant's bucket. `{tenant}` is a hash tag: a tenant's buckets share a slot, so the script works
        on Redis Cluster."""
        return self._backend.key("rl", f"{{{tenant}}}", kind)

    def degraded(self) -> RateLimitResult:
        """The answer while Redis is unreachable (module docstring)."""
        if self._backend.fail_open:
            return RateLimitResult(allowed=True, degraded=True)
        retry_after_s = self._backend.outage_retry_after_s()
        return RateLimitResult(
            allowed=False, retry_after_s=retry_after_s, reset_s=retry_after_s, degraded=True
        )
