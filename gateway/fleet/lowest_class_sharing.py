"""The lowest priority class's requests on each replica, summed over gateway instances through Redis.

Why: the top class may take the place the lowest class holds under a learned cap
(`admission.lowest_class_reserve`, "The top class"). A learned cap is on the engine's whole batch, so
every instance subtracts the requests the others run there (`ReplicaCost.foreign_requests`, from the
engine's own running + waiting count). Counting only its own lowest-class requests as places to take,
an instance behind a load balancer with k others bore the engine's whole excess over the cap while it
could lend about 1/k of the places, and critical arrivals were refused in an overload's onset where one
instance refused none (docs/bench-log/2026-12-06-shared-lowest-class.md). With the others' counts the
places lent are the engine's:

    top-class cap = learned − others' requests + own lowest + min(others' lowest, others' requests)

(`Replica.effective_max_concurrency`; the others' terms only while a cap fed by the engine's token
latency subtracts their requests).

Transport: one Redis hash per pool, `{prefix}lowest-class:{pool}`, one field per instance (random id
per process, `gateway.fleet.instance_membership.new_instance_id`) whose value is its expiry (Redis
`TIME` + `TTL_S`) and its counts, `{replica id: requests}` as JSON. Every `INTERVAL_S` ONE atomic Lua
script per pool writes this instance's field, deletes the expired fields of instances that stopped
(killed without a goodbye) and returns the other live fields; Python sums them per replica into
`Replica.foreign_lowest_class`; when a count grew, `on_more` (the registry's `notify_capacity`) lets
admission look at its waiters again, as a learned cap that grew does. An instance stopping removes its
field (`stop`). `INTERVAL_S` is half the default engine scrape interval, so the counts are about as
fresh as the others' requests they are set against; after `QUIET_SYNCS` exchanges in a row that saw no
lowest-class request anywhere the loop waits `IDLE_INTERVAL_S` instead, until one does.

Redis unreachable (the call counted in `llm_gateway_state_errors_total{operation="lowest_class_sync"}`
and logged by the backend): every `foreign_lowest_class` goes to 0 — the instance borrows only its
own lowest-class places, as with memory state, the side on which the cap holds — and the loop retries
at `IDLE_INTERVAL_S`. `state.on_error` does not apply: nothing waits on this exchange. Any other
failure (a Redis error such as OOM, or a bug) is logged with its stack trace, counted as
`operation="lowest_class_sync_loop"`, zeroes the foreign counts the same way and retries at
`IDLE_INTERVAL_S`; a failing goodbye at `stop` too (the fields expire after `TTL_S`).
Started only with Redis state and more than one priority class (with one class there is no lowest
class to count), for the pools that learn a cap (`PoolSettings.learns_cap`: only a learned cap lends).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation
from core.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

INTERVAL_S = 0.25
"""Between two exchanges while lowest-class requests run somewhere (half the default scrape interval)."""
IDLE_INTERVAL_S = 1.0
"""Between two exchanges once `QUIET_SYNCS` saw none, and after a failed call."""
QUIET_SYNCS = 4
TTL_S = 5.0
"""How long an instance's counts count after its last exchange (an instance killed without removing
its field stops counting after this)."""

_SYNC_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: the pool's hash. ARGV: now|'', ttl_s, instance_id, own counts (JSON).
-- Writes this instance's field, deletes expired ones, returns the other live fields' counts.
local now, ttl = now_s(), tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[3], fmt(now + ttl) .. '|' .. ARGV[4])
local fields = redis.call('HGETALL', KEYS[1])
local others = {}
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  local bar = string.find(value, '|', 1, true)
  local expiry = bar and tonumber(string.sub(value, 1, bar - 1)) or 0
  if expiry < now then
    redis.call('HDEL', KEYS[1], name)
  elseif name ~= ARGV[3] then
    others[#others + 1] = string.sub(value, bar + 1)
  end
end
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000) + 1000)
return others
"""
)

_LEAVE_LUA = """
-- KEYS[1]: the pool's hash. ARGV: now|'', instance_id.
redis.call('HDEL', KEYS[1], ARGV[2])
return 1
"""


class CountedReplica(Protocol):
    """What the exchange reads and writes on a replica (`gateway.upstream.replica.Replica` fits)."""

    lowest_class_inflight: int
    foreign_lowest_class: int


class CountedPool(Protocol):
    """A pool's replicas by id (`gateway.upstream.registry.Pool` fits)."""

    @property
    def replicas(self) -> Mapping[str, CountedReplica]: ...


def sum_counts(payloads: list[Any]) -> dict[str, int]:
    """The other instances' counts summed per replica; a malformed payload counts for nothing."""
    total: dict[str, int] = {}
    for payload in payloads:
        try:
            counts = json.loads(payload)
        except (TypeError, ValueError):
            continue
        if not isinstance(counts, dict):
            continue
        for replica_id, count in counts.items():
            if isinstance(count, int) and count > 0:
                total[replica_id] = total.get(replica_id, 0) + count
    return total


class LowestClassSharing:
    """The exchange of every pool's lowest-class counts (module docstring); `start`, then `stop`."""

    def __init__(
        self,
        backend: RedisBackend,
        pools: Mapping[str, CountedPool],
        instance_id: str,
        *,
        on_more: Callable[[], None] | None = None,
        on_loop_error: Callable[[], None] | None = None,
    ) -> None:
        self._backend = backend
        self._on_more = on_more
        self._pools = pools
        self._instance_id = instance_id
        self._sync = backend.register(_SYNC_LUA)
        self._leave = backend.register(_LEAVE_LUA)
        self._on_loop_error = on_loop_error
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the loop (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lowest-class-sharing")

    async def stop(self) -> None:
        """Stop the loop and remove this instance's fields. Redis unreachable (known from the last call)
        or failing: they expire by themselves after `TTL_S` (a failure is logged and counted)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        self._forget_all()
        if not self._backend.available:
            return
        try:
            for name in self._pools:
                await self._backend.run(
                    RedisOperation.LOWEST_CLASS_SYNC, self._leave, [self._key(name)], [self._instance_id]
                )
        except Exception:
            logger.exception("lowest-class counts: leaving failed; the fields expire after %.1f s", TTL_S)
            if self._on_loop_error is not None:
                self._on_loop_error()

    async def sync_once(self) -> bool:
        """One exchange for every pool; True when a lowest-class request ran anywhere, False when none
        did or Redis could not be reached (then every foreign count is 0)."""
        seen = more = False
        for name, pool in self._pools.items():
            replicas = pool.replicas
            own = {rid: r.lowest_class_inflight for rid, r in replicas.items() if r.lowest_class_inflight > 0}
            reply = await self._backend.run(
                RedisOperation.LOWEST_CLASS_SYNC,
                self._sync,
                [self._key(name)],
                [repr(TTL_S), self._instance_id, json.dumps(own, separators=(",", ":"))],
            )
            if reply is None:
                self._forget(pool)
                continue
            others = sum_counts(list(reply))
            for replica_id, replica in replicas.items():
                count = others.get(replica_id, 0)
                more = more or count > replica.foreign_lowest_class
                replica.foreign_lowest_class = count
            seen = seen or bool(own) or bool(others)
        if more and self._on_more is not None:
            self._on_more()
        return seen

    def _key(self, pool_name: str) -> str:
        return self._backend.key("lowest-class", pool_name)

    @staticmethod
    def _forget(pool: CountedPool) -> None:
        for replica in pool.replicas.values():
            replica.foreign_lowest_class = 0

    def _forget_all(self) -> None:
        for pool in self._pools.values():
            self._forget(pool)

    async def _run(self) -> None:
        quiet = 0
        while True:
            failed = False
            try:
                seen = await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a Redis error other than unreachable (e.g. OOM), or a bug
                logger.exception("lowest-class count exchange failed")
                if self._on_loop_error is not None:
                    self._on_loop_error()
                self._forget_all()  # counts not refreshed are not lent
                seen, failed = False, True
            quiet = 0 if seen else quiet + 1
            calm = quiet >= QUIET_SYNCS or failed or not self._backend.available
            await asyncio.sleep(IDLE_INTERVAL_S if calm else INTERVAL_S)
