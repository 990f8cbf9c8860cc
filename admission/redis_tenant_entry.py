"""A tenant's rate limits and bulkhead in ONE atomic Redis script (`TenantGate.enter` with Redis state).

Without it, a request of a tenant with both per-minute limits and `max_concurrent` makes two round
trips on entry: the rate-limit script (`admission.redis_rate_limit`), then the lease acquire
(`admission.redis_leases`). Here one script does both, with the same arithmetic and the same outcome:

- the buckets are read and checked as `RedisRateLimitStore.acquire` does; when one refuses nothing is
  charged and no lease is taken (the rate-limit refusal);
- when they allow, the lease set is pruned and counted as `RedisLeaseStore.acquire` does; below the cap
  the lease is added and every bucket charged; at the cap (the bulkhead refusal) the request bucket is
  charged and the token bucket is not (an attempt counts as a request; the two-call path charges the
  tokens and refunds them at once, which ends at the same level).
- Keys, values and expiries are exactly those of the two stores, so the lease is renewed and released
  by `RedisLeaseStore`, and instances running either path share one bulkhead and one set of buckets.
- Redis unreachable: `fail_open` → allowed, `degraded`, with a degraded lease; `fail_closed` → the
  rate-limit store's degraded refusal (503 `state_unavailable` at the gate), as the two-call path's
  first call answers. Errors are counted as `rate_limit_acquire`.

Time is the Redis server's. The script touches a tenant's bucket keys and its lease set together (the
gateway's client is a single-node one).
"""

from __future__ import annotations

from typing import Any

from admission.leases import Lease, LeaseScope, random_lease_id, validate_lease_args
from admission.rate_limit import LEVEL_EPSILON, LimitKind, RateLimitResult, TenantRateLimits
from admission.redis_leases import KEY_TTL_LUA, RedisLeaseStore
from admission.redis_rate_limit import BUCKET_LEVEL_LUA, RedisRateLimitStore, bucket_readings
from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation

_ENTER_LUA = (
    LUA_PRELUDE
    + BUCKET_LEVEL_LUA
    + KEY_TTL_LUA
    + """
-- KEYS: the buckets, then the lease set. ARGV: now|'', epsilon, cap, ttl_s, lease_id, then per bucket i:
--   ARGV[2+4i] capacity, ARGV[3+4i] refill/s, ARGV[4+4i] cost, ARGV[5+4i] '1' when not charged on a
--   bulkhead refusal. Returns {allowed, acquired, then per bucket: remaining, reset_s, retry_s}.
local now, eps = now_s(), tonumber(ARGV[2])
local n, lease_key = #KEYS - 1, KEYS[#KEYS]
local levels, caps, rates, costs = {}, {}, {}, {}
local allowed = 1
for i = 1, n do
  local b = 2 + 4 * i
  caps[i], rates[i] = tonumber(ARGV[b]), tonumber(ARGV[b + 1])
  costs[i] = math.min(tonumber(ARGV[b + 2]), caps[i])
  levels[i] = bucket_level(KEYS[i], caps[i], rates[i], now)
  if levels[i] + eps < costs[i] then allowed = 0 end
end
local acquired = 0
if allowed == 1 then
  local ttl = tonumber(ARGV[4])
  redis.call('ZREMRANGEBYSCORE', lease_key, '-inf', fmt(now))
  if redis.call('ZCARD', lease_key) < tonumber(ARGV[3]) then
    redis.call('ZADD', lease_key, fmt(now + ttl), ARGV[5])
    keep_key(lease_key, ttl)
    acquired = 1
  end
end
local out = {allowed, acquired}
for i = 1, n do
  local remaining, retry = levels[i], 0
  if allowed == 1 and (acquired == 1 or ARGV[5 + 4 * i] ~= '1') then
    remaining = levels[i] - costs[i]
    bucket_store(KEYS[i], caps[i], rates[i], remaining, now)
  elseif allowed == 0 then
    retry = math.max(0, costs[i] - levels[i]) / rates[i]
  end
  bucket_reading(out, caps[i], rates[i], remaining, retry)
end
return out
"""
)


class RedisTenantEntry:
    """Rate limits and bulkhead lease of one request in one script (module docstring)."""

    def __init__(
        self, backend: RedisBackend, rate_limits: RedisRateLimitStore, leases: RedisLeaseStore
    ) -> None:
        if leases.scope is not LeaseScope.TENANT:
            raise ValueError(f"the bulkhead needs a tenant-scope lease store (got {leases.scope})")
        self._backend = backend
        self._rate_limits = rate_limits
        self._leases = leases
        self._script = backend.register(_ENTER_LUA)

    async def enter(
        self, tenant: str, limits: TenantRateLimits, estimated_tokens: int, cap: int, ttl_s: float
    ) -> tuple[RateLimitResult, Lease | None]:
        """The rate-limit decision and, when it allowed, the lease (None at the cap)."""
        validate_lease_args(cap, ttl_s)
        wanted = limits.costs(estimated_tokens)
        lease_id = random_lease_id()
        args: list[Any] = [repr(LEVEL_EPSILON), cap, repr(ttl_s), lease_id]
        for kind, limit, cost in wanted:
            refunded = "1" if kind is LimitKind.TOKENS else "0"
            args += [repr(limit.capacity), repr(limit.refill_per_s), repr(cost), refunded]
        keys = [self._rate_limits.key(tenant, kind) for kind, _, _ in wanted] + [self._leases.key(tenant)]
        reply = await self._backend.run(RedisOperation.RATE_LIMIT_ACQUIRE, self._script, keys, args)
        if reply is None:
            result = self._rate_limits.degraded()
            lease = (
                Lease(LeaseScope.TENANT, tenant, lease_id, ttl_s, degraded=True) if result.allowed else None
            )
            return result, lease
        result = RateLimitResult.from_readings(int(reply[0]) == 1, bucket_readings(wanted, reply, first=2))
        lease = Lease(LeaseScope.TENANT, tenant, lease_id, ttl_s) if int(reply[1]) == 1 else None
        return result, lease
