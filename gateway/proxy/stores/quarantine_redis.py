"""The quarantine shared by every gateway instance through Redis (see `gateway.proxy.stores.quarantine`).

One sorted set per pool, `{prefix}quarantine:{model}`: member = fingerprint, score = expiry (Redis
server `TIME`, seconds). Two atomic scripts:
- add: drop expired members, `ZADD now + ttl`, trim to `max_entries` (the soonest to expire go first),
  keep the key alive for the ttl;
- sync: drop expired members, return every live member with its remaining seconds.

Arrivals never wait for Redis: `contains` reads a local mirror (`MemoryQuarantine`), which a sync
refreshes every `SYNC_INTERVAL_S` (a background loop started by the composition root) and `add`
updates at once. So an instance sees another's quarantine within about a second, and a fingerprint
quarantined here is refused here immediately.

Redis unreachable (counted in `llm_gateway_state_errors_total{operation="quarantine_add" |
"quarantine_sync"}`; a failure of the sync loop itself is logged with its stack trace and counted as
`operation="quarantine_sync_loop"`): `add` still quarantines locally, and the mirror keeps its entries
(each expires on its own) until a sync reaches Redis again. Quarantine is a protection, not an
admission decision: `state.on_error` does not apply.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from core.clock import Clock
from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation
from core.tasks import cancel_and_wait
from gateway.proxy.stores.quarantine import MemoryQuarantine

logger = logging.getLogger(__name__)

SYNC_INTERVAL_S = 1.0

_ADD_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: the pool's set. ARGV: now|'', ttl_s, max_entries, fingerprint.
local now, ttl, cap = now_s(), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
redis.call('ZADD', KEYS[1], fmt(now + ttl), ARGV[4])
local excess = redis.call('ZCARD', KEYS[1]) - cap
if excess > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1) end
local keep = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return 1
"""
)

_SYNC_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: the pool's set. ARGV: now|''. Returns {fingerprint, remaining_s, ...} of the live members.
local now = now_s()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
local out = {}
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  out[#out + 1] = members[i]
  out[#out + 1] = fmt(tonumber(members[i + 1]) - now)
end
return out
"""
)


class RedisQuarantine:
    """A pool's quarantine in Redis with a local mirror (module docstring)."""

    def __init__(
        self, backend: RedisBackend, model: str, clock: Clock, *, ttl_s: float, max_entries: int
    ) -> None:
        self._backend = backend
        self._key = backend.key("quarantine", model)
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._local = MemoryQuarantine(clock, ttl_s, max_entries)
        self._add = backend.register(_ADD_LUA)
        self._sync = backend.register(_SYNC_LUA)

    @property
    def active(self) -> bool:
        return self._local.active

    def contains(self, key: str) -> bool:
        return self._local.contains(key)

    async def add(self, key: str) -> None:
        await self._local.add(key)
        args = [repr(self._ttl_s), str(self._max_entries), key]
        await self._backend.run(RedisOperation.QUARANTINE_ADD, self._add, [self._key], args)

    async def sync(self) -> bool:
        """Refresh the local mirror from Redis; False when Redis was unreachable (mirror kept)."""
        reply = await self._backend.run(RedisOperation.QUARANTINE_SYNC, self._sync, [self._key], [])
        if reply is None:
            return False
        now_s = self._clock.now_s()
        pairs = zip(reply[0::2], reply[1::2], strict=True)
        self._local.replace_all({str(key): now_s + float(remaining) for key, remaining in pairs})
        return True


class Synced(Protocol):
    """A store with a local mirror of Redis: `sync` refreshes it (False when Redis was unreachable)."""

    async def sync(self) -> bool: ...


class QuarantineSync:
    """The background loop that keeps every pool's Redis mirrors fresh: its quarantine, and its poison
    evidence (`gateway.proxy.stores.poison_evidence_redis`)."""

    def __init__(
        self,
        stores: list[Synced],
        interval_s: float = SYNC_INTERVAL_S,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._stores = stores
        self._interval_s = interval_s
        self._on_error = on_error
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._stores and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="quarantine-sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])

    async def _run(self) -> None:
        while True:
            for store in self._stores:
                try:
                    await store.sync()
                except Exception:  # a script bug must not end the loop: log it, count it, go on
                    logger.exception("quarantine sync failed")
                    if self._on_error is not None:
                        self._on_error()
            await asyncio.sleep(self._interval_s)
