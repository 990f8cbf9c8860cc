"""Slot leases in Redis, so a concurrency cap holds across gateway instances (see `admission.leases`).

Each resource is a sorted set `{prefix}lease:{scope}:{resource_id}` of lease ids scored by expiry time
(Redis server `TIME`, seconds), e.g. `llm-gateway:lease:replica:{model}@{host}:{port}` for a pool's
slots on a replica (one cap per pool and replica; the id is built by
`gateway.upstream.slot_credit_ledger.slot_resource_id`). Every operation is one atomic Lua script:

- acquire: `ZREMRANGEBYSCORE -inf now` (reclaim expired leases, e.g. of an instance killed with
  SIGKILL) → `ZCARD` → if below cap, `ZADD now + ttl` — prune, check and add cannot interleave with
  another instance's, so 50 concurrent acquires against cap 5 admit exactly 5;
- renew: the lease must exist and be unexpired, then `ZADD XX now + ttl`;
- release: prune, then `ZREM`;
- count: `ZCOUNT (now +inf` (read-only).
The set's key TTL is kept ≥ the longest lease ttl + 1 s, so a resource nobody uses leaves no key.

While Redis is unreachable (`RedisBackend`): `fail_open` grants a `Lease(degraded=True)` (the cap is
then enforced only by each instance's own accounting) and `renew` answers True; `fail_closed` refuses
acquires and `renew` answers False. `release` answers False (the lease will expire by itself), `count` 0.
"""

from __future__ import annotations

from collections.abc import Callable

from admission.leases import Lease, LeaseScope, random_lease_id, validate_lease_args
from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation

KEY_TTL_LUA = """
local function keep_key(key, ttl)
  local want = math.ceil(ttl * 1000) + 1000
  if redis.call('PTTL', key) < want then redis.call('PEXPIRE', key, want) end
end
"""

_ACQUIRE_LUA = (
    LUA_PRELUDE
    + KEY_TTL_LUA
    + """
-- KEYS[1]: lease set. ARGV: now|'', cap, ttl_s, lease_id. Returns {acquired 0|1, held after}.
local now, cap, ttl = now_s(), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
local held = redis.call('ZCARD', KEYS[1])
if held >= cap then return {0, held} end
redis.call('ZADD', KEYS[1], fmt(now + ttl), ARGV[4])
keep_key(KEYS[1], ttl)
return {1, held + 1}
"""
)

_RENEW_LUA = (
    LUA_PRELUDE
    + KEY_TTL_LUA
    + """
-- KEYS[1]: lease set. ARGV: now|'', ttl_s, lease_id. Returns 1 when renewed, 0 when lost.
local now, ttl = now_s(), tonumber(ARGV[2])
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[3])
if not expiry then return 0 end
if tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[1], ARGV[3])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', fmt(now + ttl), ARGV[3])
keep_key(KEYS[1], ttl)
return 1
"""
)

_RELEASE_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: lease set. ARGV: now|'', lease_id. Returns 1 when it was held (unexpired), else 0.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now_s()))
return redis.call('ZREM', KEYS[1], ARGV[2])
"""
)

_COUNT_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: lease set. ARGV: now|''. Unexpired leases.
return redis.call('ZCOUNT', KEYS[1], '(' .. fmt(now_s()), '+inf')
"""
)


class RedisLeaseStore:
    """`LeaseStore` over Redis sorted sets; see the module docstring."""

    def __init__(
        self, backend: RedisBackend, scope: LeaseScope, id_factory: Callable[[], str] = random_lease_id
    ) -> None:
        self._backend = backend
        self._scope = scope
        self._id_factory = id_factory
        self._acquire = backend.register(_ACQUIRE_LUA)
        self._renew = backend.register(_RENEW_LUA)
        self._release = backend.register(_RELEASE_LUA)
        self._count = backend.register(_COUNT_LUA)

    @property
    def scope(self) -> LeaseScope:
        """Which cap this store enforces."""
        return self._scope

    async def acquire(self, resource_id: str, cap: int, ttl_s: float) -> Lease | None:
        """See `LeaseStore.acquire`."""
        validate_lease_args(cap, ttl_s)
        lease_id = self._id_factory()
        reply = await self._backend.run(
            RedisOperation.LEASE_ACQUIRE,
            self._acquire,
            [self.key(resource_id)],
            [cap, repr(ttl_s), lease_id],
        )
        if reply is None:
            if not self._backend.fail_open:
                return None
            return Lease(self._scope, resource_id, lease_id, ttl_s, degraded=True)
        return Lease(self._scope, resource_id, lease_id, ttl_s) if int(reply[0]) == 1 else None

    async def renew(self, lease: Lease) -> bool:
        """See `LeaseStore.renew`."""
        if lease.degraded:
            return True
        reply = await self._backend.run(
            RedisOperation.LEASE_RENEW,
            self._renew,
            [self.key(lease.resource_id)],
            [repr(lease.ttl_s), lease.lease_id],
        )
        return self._backend.fail_open if reply is None else int(reply) == 1

    async def release(self, lease: Lease) -> bool:
        """See `LeaseStore.release`."""
        if lease.degraded:
            return True
        reply = await self._backend.run(
            RedisOperation.LEASE_RELEASE, self._release, [self.key(lease.resource_id)], [lease.lease_id]
        )
        return reply is not None and int(reply) == 1

    async def count(self, resource_id: str) -> int:
        """See `LeaseStore.count` (0 while Redis is unreachable)."""
        reply = await self._backend.run(RedisOperation.LEASE_COUNT, self._count, [self.key(resource_id)], [])
        return 0 if reply is None else int(reply)

    def key(self, resource_id: str) -> str:
        """The sorted set of `resource_id`'s leases (module docstring)."""
        return self._backend.key("lease", self._scope, resource_id)
