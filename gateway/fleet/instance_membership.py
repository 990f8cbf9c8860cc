"""Gateway membership: how many gateway instances share the traffic, for the autoscaling signal's share.

With k gateway instances behind a load balancer each sees ≈ 1/k of a pool's arrivals, so each pool's
`PoolAutoscaler` divides its arrival rates by the traffic share 1/k (`gateway.fleet.autoscaling`). k is, per
pool, `autoscale.gateway_instances` when set; otherwise, with `state.backend: redis`, the number of
live instances measured here, and 1 with memory state.

Measurement (`state.backend: redis`): every instance keeps a member in one sorted set,
`{prefix}gateways`, scored by its expiry time (Redis server `TIME`, seconds). Each heartbeat is ONE
atomic Lua script — `ZREMRANGEBYSCORE -inf now` (drop the members of instances that stopped beating),
`ZADD now + ttl` (this instance), `ZCARD` — whose answer is k. The ttl is `state.replica_lease_ttl_s`
(default 10 s), the heartbeat period ttl / 3, as for slot credits: the member of an instance killed
with SIGKILL expires at most ttl after its last heartbeat, and every other instance counts it out at its
next heartbeat after that (≤ ttl + ttl / 3). A graceful stop leaves at once (`ZREM`, at the start of
the drain: a draining instance gets no new arrivals). The instance id is random per process
(hostname + 64 random bits), never reused across restarts, so a restarted instance never renews the
member of its previous life. The set's key expires ttl + 1 s after the last heartbeat of any instance.

Redis unreachable (counted in `llm_gateway_state_errors_total{operation="membership_heartbeat"}` and
logged by the `RedisBackend` at most once per interval): k stays at its last measured value (1 before
the first measurement), whatever `state.on_error` says — k is not an admission decision; the next
heartbeat that reaches Redis measures it again. An instance cut off from Redis while the others reach
it is counted out by them after the ttl: they then overestimate the pool by k / (k − 1), the safe side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Protocol

from core.clock import Clock
from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation

logger = logging.getLogger(__name__)

HEARTBEATS_PER_TTL = 3
"""Heartbeats per ttl: a member survives two lost heartbeats in a row."""

_HEARTBEAT_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: member set. ARGV: now|'', ttl_s, instance_id. Returns the live members, this one included.
local now, ttl = now_s(), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
redis.call('ZADD', KEYS[1], fmt(now + ttl), ARGV[3])
local keep = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return redis.call('ZCARD', KEYS[1])
"""
)

_LEAVE_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: member set. ARGV: now|'', instance_id. Returns the live members left.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now_s()))
redis.call('ZREM', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""
)


def new_instance_id() -> str:
    """`{hostname}/{16 hex digits}`: random per process (the hostname only helps an operator read it)."""
    return f"{socket.gethostname()}/{os.urandom(8).hex()}"


def traffic_share(configured: int | None, measured: int) -> float:
    """1/k with k the configured instance count if set, else the measured one; k < 1 counts as 1."""
    k = configured if configured is not None else measured
    return 1.0 / max(1, k)


class MembershipStore(Protocol):
    """Where the members live (`RedisMembership`; tests use fakes)."""

    async def heartbeat(self, instance_id: str, ttl_s: float) -> int | None:
        """Register or refresh `instance_id` for `ttl_s`; the live members, None when unreachable."""
        ...

    async def leave(self, instance_id: str) -> int | None:
        """Remove `instance_id`; the live members left, None when unreachable."""
        ...


class RedisMembership:
    """The member set in Redis (module docstring): one atomic script per call."""

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._heartbeat = backend.register(_HEARTBEAT_LUA)
        self._leave = backend.register(_LEAVE_LUA)
        self._key = backend.key("gateways")

    async def heartbeat(self, instance_id: str, ttl_s: float) -> int | None:
        """Register or refresh `instance_id` until now + `ttl_s`; the live members (≥ 1), or None when
        Redis is unreachable."""
        reply = await self._backend.run(
            RedisOperation.MEMBERSHIP_HEARTBEAT, self._heartbeat, [self._key], [repr(ttl_s), instance_id]
        )
        return None if reply is None else int(reply)

    async def leave(self, instance_id: str) -> int | None:
        """Remove `instance_id`; the live members left, or None when Redis is unreachable (the member
        then expires by itself)."""
        reply = await self._backend.run(
            RedisOperation.MEMBERSHIP_LEAVE, self._leave, [self._key], [instance_id]
        )
        return None if reply is None else int(reply)


class InstanceCount:
    """k as last measured, and the share 1/k (pure: time only from the injected clock).

    `observe(live)` takes a heartbeat's answer: the live member count, or None when Redis could not be
    reached, which keeps the last known k. k starts at 1 and is never below 1.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._k = 1
        self._measured_at_s: float | None = None
        self._failures = 0

    @property
    def k(self) -> int:
        """The live gateway instances, this one included (the last known count)."""
        return self._k

    @property
    def share(self) -> float:
        """1/k: the fraction of the traffic this instance sees."""
        return 1.0 / self._k

    @property
    def failures(self) -> int:
        """Heartbeats in a row that could not reach Redis (0 after a measurement)."""
        return self._failures

    def age_s(self) -> float | None:
        """Seconds since k was last measured; None before the first measurement."""
        return None if self._measured_at_s is None else self._clock.now_s() - self._measured_at_s

    def observe(self, live: int | None) -> bool:
        """Record a heartbeat's answer; True when k changed."""
        if live is None:
            self._failures += 1
            return False
        self._failures = 0
        self._measured_at_s = self._clock.now_s()
        k = max(1, live)
        changed, self._k = k != self._k, k
        return changed


class GatewayMembership:
    """This instance's heartbeat (module docstring): `start()`, then `leave()` on a graceful stop.

    `on_count(k)` runs whenever the measured k changes (the autoscalers' share); `on_error()` when the
    heartbeat loop itself fails unexpectedly (a bug, not an unreachable Redis: that is the backend's
    to count), after which it goes on at the next period.
    """

    def __init__(
        self,
        store: MembershipStore,
        *,
        ttl_s: float,
        clock: Clock,
        on_count: Callable[[int], None],
        on_error: Callable[[], None] | None = None,
        instance_id: str | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self._store = store
        self._ttl_s = ttl_s
        self._on_count = on_count
        self._on_error = on_error
        self.instance_id = instance_id if instance_id is not None else new_instance_id()
        self.count = InstanceCount(clock)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._left = False

    @property
    def period_s(self) -> float:
        """Seconds between heartbeats: ttl / `HEARTBEATS_PER_TTL`."""
        return self._ttl_s / HEARTBEATS_PER_TTL

    async def heartbeat(self) -> int:
        """One heartbeat: refresh this instance's member and measure k; returns k (the last known one
        when Redis is unreachable). Does nothing once left."""
        if self._left:
            return self.count.k
        live = await self._store.heartbeat(self.instance_id, self._ttl_s)
        before = self.count.k
        if self.count.observe(live):
            logger.info(
                "gateway instances: %d -> %d (traffic share %.3f)", before, self.count.k, self.count.share
            )
            self._on_count(self.count.k)
        elif live is None and self.count.failures == 1:
            age_s = self.count.age_s()
            measured = "never measured" if age_s is None else f"measured {age_s:.1f} s ago"
            logger.warning(
                "gateway membership: redis unreachable; keeping %d gateway instance(s) (%s) until it answers",
                self.count.k,
                measured,
            )
        return self.count.k

    def start(self) -> None:
        """Start heartbeating (the first heartbeat at once); call from the running event loop."""
        if self._task is None and not self._left:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-membership")

    async def leave(self) -> None:
        """Stop heartbeating (letting a heartbeat in flight finish, so it cannot re-add the member
        afterwards) and remove this instance's member at once. Idempotent."""
        if self._left:
            return
        self._left = True
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception):
                await task
        try:
            await self._store.leave(self.instance_id)
        except Exception:
            logger.exception(
                "gateway membership: leaving failed; the member expires after %.1f s", self._ttl_s
            )
            if self._on_error is not None:
                self._on_error()

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.heartbeat()
            except Exception:
                logger.exception("gateway membership heartbeat failed; retrying in %.1f s", self.period_s)
                if self._on_error is not None:
                    self._on_error()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.period_s)
