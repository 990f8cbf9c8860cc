"""The prefix index shared by every gateway instance through Redis (`state.share_prefix_index`).

A policy that keeps a prefix index (`prefix-index`, `sticky-prefix`, `predicted-latency`) learns where
prefixes live from its own routing decisions, so with k instances behind a load balancer each index
sees 1/k of the traffic and places most repeated prefixes as if they were new. Here every instance
publishes its index records — (pool, replica id, block hashes): hashes only, never prompt text — and
applies the other instances' records to its own `PrefixIndex` (`merge`), so each index sees the whole
fleet's traffic. The routing decision never waits on Redis: `PrefixIndex.record` hands the record to a
listener that appends it to a bounded local buffer (no I/O), and one background loop per instance does
the exchange.

Transport: one capped Redis stream, `{prefix}prefix-index`, each entry one batch of records from one
instance (fields `i` = instance id, `d` = the encoded batch). Every `SYNC_INTERVAL_S` (50 ms) ONE atomic
Lua script appends this instance's pending records (`XADD MAXLEN ~ STREAM_MAX_BATCHES`, at most
`MAX_RECORDS_PER_BATCH` per entry) and returns the entries after the last one this instance read
(`XRANGE`, at most `READ_BATCHES_PER_SYNC`, its own left out): one round trip per interval per
instance, whatever the request rate. After `QUIET_SYNCS` syncs in a row that moved nothing the
interval doubles, up to `IDLE_INTERVAL_S` (1 s), until one moves something; a local record wakes the
loop at once. So an idle instance does not wake 20 times a second for nothing (each wake-up and script
call costs several hundred µs of CPU here and on the server). Chosen over pub/sub because the stream
gives one total order across instances and is replayable: an instance that lost Redis for a moment
resumes from its last entry, and a new one starts `REPLAY_S` (30 s) back, so a restarted instance is
warm at once; pub/sub delivers at most once, to connected subscribers only, on a dedicated connection.
The price is up to one interval of staleness, which matters only for a second request with a new
prefix arriving at another instance within 50 ms of the first (at an instance idle that long, within
`IDLE_INTERVAL_S`, for its first request: its record wakes the loop, which applies what is pending).

Memory: the buffer holds at most `MAX_PENDING_RECORDS` records (the oldest are dropped beyond it); the
stream at most ≈ `STREAM_MAX_BATCHES` entries (≈ 1.5 KB per record of 136 blocks, the key expiring
`STREAM_TTL_S` after the last publish); each `PrefixIndex` keeps its own bounds (remote records are
applied with `merge`, under the same LRU). Records for a pool this instance does not serve, or for a
replica not (or no longer) in the pool, are ignored.

Codec: `gateway.fleet.prefix_records` (JSON, hashes as base64). A malformed batch is counted and skipped.

Redis unreachable: each instance routes on its own index (its local records are applied locally
anyway); the records it made meanwhile are dropped, not queued. Logged once when the exchange stops
and once when it resumes; `llm_gateway_prefix_index_sharing_up` is 0 meanwhile, every failed call is
counted in `llm_gateway_state_errors_total{operation="prefix_index_sync"}` (the loop then retries
every `OUTAGE_RETRY_S`), and a failure of the loop itself is logged with its stack trace and counted as
`operation="prefix_index_sync_loop"`. No request ever fails or waits because of it; `state.on_error`
does not apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence

from prometheus_client import Counter, Gauge

from core.shared_state import LUA_PRELUDE, RedisBackend
from core.state_outage import RedisOperation
from core.tasks import cancel_and_wait
from gateway.base.metric_naming import PREFIX, WORKERS_MIN
from gateway.base.metrics import GatewayMetrics
from gateway.fleet.instance_membership import new_instance_id
from gateway.fleet.prefix_records import IndexRecord, decode_batch, encode_batch
from router.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)

SYNC_INTERVAL_S = 0.05
QUIET_SYNCS = 20
IDLE_INTERVAL_S = 1.0
OUTAGE_RETRY_S = 1.0
MAX_PENDING_RECORDS = 4096
MAX_RECORDS_PER_BATCH = 64
READ_BATCHES_PER_SYNC = 128
STREAM_MAX_BATCHES = 1024
STREAM_TTL_S = 600.0
REPLAY_S = 30.0

_SYNC_LUA = (
    LUA_PRELUDE
    + """
-- KEYS[1]: the stream. ARGV: now|'', max_batches, ttl_ms, last_id ('' = replay_ms back from now),
-- replay_ms, read_count, instance_id, batch ('' = nothing to publish).
-- Returns {last_id, batch, ...}: the batches of the other instances after last_id, in stream order.
local key, me = KEYS[1], ARGV[7]
local last = ARGV[4]
if last == '' then
  last = string.format('%d-0', math.max(0, math.floor(now_s() * 1000) - tonumber(ARGV[5])))
end
if ARGV[8] ~= '' then
  redis.call('XADD', key, 'MAXLEN', '~', ARGV[2], '*', 'i', me, 'd', ARGV[8])
  redis.call('PEXPIRE', key, ARGV[3])
end
local out = {last}
for _, entry in ipairs(redis.call('XRANGE', key, last, '+', 'COUNT', tonumber(ARGV[6]) + 1)) do
  if entry[1] ~= last then
    out[1] = entry[1]
    local fields, from, data = entry[2], nil, nil
    for j = 1, #fields, 2 do
      if fields[j] == 'i' then from = fields[j + 1] elseif fields[j] == 'd' then data = fields[j + 1] end
    end
    if from ~= me and data ~= nil then out[#out + 1] = data end
  end
end
return out
"""
)


class SharingMetrics:
    """`llm_gateway_prefix_index_sharing_up` and `llm_gateway_prefix_index_records_total{direction}`."""

    DIRECTIONS = ("published", "applied", "dropped", "ignored")

    def __init__(self, metrics: GatewayMetrics) -> None:
        r = metrics.registry
        self.up = Gauge(
            f"{PREFIX}_prefix_index_sharing_up",
            "1 while this instance exchanges prefix-index records through Redis, 0 while it routes on its "
            "own index alone",
            registry=r,
            multiprocess_mode=WORKERS_MIN,
        )
        self.records = Counter(
            f"{PREFIX}_prefix_index_records_total",
            "Prefix-index records: published, applied (from other instances), dropped (not published: "
            "buffer full or Redis unreachable), ignored (unknown pool or replica, malformed)",
            ["direction"],
            registry=r,
        )
        for direction in self.DIRECTIONS:
            self.records.labels(direction)
        self.sync_errors = metrics.state_errors_total.labels("prefix_index_sync_loop")


class PrefixIndexSharing:
    """Exchanges the prefix-index records of this instance's pools with the others (module docstring)."""

    def __init__(
        self,
        backend: RedisBackend,
        indexes: Mapping[str, PrefixIndex],
        members: Callable[[str], Collection[str]],
        metrics: SharingMetrics,
        *,
        interval_s: float = SYNC_INTERVAL_S,
        idle_interval_s: float = IDLE_INTERVAL_S,
        instance_id: str | None = None,
        max_pending_records: int = MAX_PENDING_RECORDS,
    ) -> None:
        self._backend = backend
        self._indexes = dict(indexes)
        self._members = members
        self._metrics = metrics
        self._interval_s = interval_s
        self._idle_interval_s = max(interval_s, idle_interval_s)
        self._quiet_syncs = 0  # syncs in a row that moved nothing
        self._wake = asyncio.Event()
        self._dozing = False  # the loop sleeps longer than interval_s: a local record wakes it
        self._instance_id = instance_id or new_instance_id()
        self._key = backend.key("prefix-index")
        self._script = backend.register(_SYNC_LUA)
        self._pending: deque[IndexRecord] = deque(maxlen=max_pending_records)
        self._last_id = ""
        self._up = True
        self._task: asyncio.Task[None] | None = None
        metrics.up.set(1)
        for pool, index in self._indexes.items():
            index.listen(self._listener(pool))

    @property
    def up(self) -> bool:
        """False from a sync that could not reach Redis until the next one that did."""
        return self._up

    @property
    def pending(self) -> int:
        """Local records not yet published."""
        return len(self._pending)

    def _listener(self, pool: str) -> Callable[[str, Sequence[int]], None]:
        pending, dropped = self._pending, self._metrics.records.labels("dropped")

        def on_record(replica_id: str, block_hashes: Sequence[int]) -> None:
            if len(pending) == pending.maxlen:
                dropped.inc()  # the append below pushes the oldest out
            pending.append(IndexRecord(pool, replica_id, tuple(block_hashes)))
            if self._dozing:
                self._dozing = False
                self._wake.set()

        return on_record

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="prefix-index-sharing")

    async def stop(self) -> None:
        """Stop the loop, publish what is pending (one last bounded try) and stop listening."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
            if self._pending:
                with contextlib.suppress(Exception):
                    await self.sync()
        for index in self._indexes.values():
            index.listen(None)

    async def sync(self) -> bool:
        """Publish up to one batch of pending records and apply the other instances' new ones; True when
        more is waiting on either side (the loop then syncs again at once)."""
        batch = [self._pending.popleft() for _ in range(min(len(self._pending), MAX_RECORDS_PER_BATCH))]
        payload = self._encode(batch)
        args = [
            str(STREAM_MAX_BATCHES),
            str(int(STREAM_TTL_S * 1000)),
            self._last_id,
            str(int(REPLAY_S * 1000)),
            str(READ_BATCHES_PER_SYNC),
            self._instance_id,
            payload,
        ]
        reply = await self._backend.run(RedisOperation.PREFIX_INDEX_SYNC, self._script, [self._key], args)
        if reply is None:
            self._metrics.records.labels("dropped").inc(len(batch))
            self._set_up(False)
            return False
        self._set_up(True)
        self._quiet_syncs = 0 if payload or len(reply) > 1 else self._quiet_syncs + 1
        if payload:
            self._metrics.records.labels("published").inc(len(batch))
        self._last_id = str(reply[0])
        for entry in reply[1:]:
            self._apply(str(entry))
        return len(reply) - 1 >= READ_BATCHES_PER_SYNC or len(self._pending) >= MAX_RECORDS_PER_BATCH

    def _encode(self, batch: list[IndexRecord]) -> str:
        if not batch:
            return ""
        try:
            return encode_batch(batch)
        except ValueError:
            logger.exception("prefix index sharing: a batch could not be encoded; not published")
            self._metrics.records.labels("dropped").inc(len(batch))
            return ""

    def _apply(self, payload: str) -> None:
        try:
            records = decode_batch(payload)
        except ValueError as exc:
            logger.warning("prefix index sharing: a malformed batch was skipped (%s)", exc)
            self._metrics.records.labels("ignored").inc()
            return
        applied = ignored = 0
        for record in records:
            index = self._indexes.get(record.pool)
            if index is None or record.replica_id not in self._members(record.pool):
                ignored += 1
                continue
            index.merge(record.replica_id, record.block_hashes)
            applied += 1
        self._metrics.records.labels("applied").inc(applied)
        self._metrics.records.labels("ignored").inc(ignored)

    def _set_up(self, up: bool) -> None:
        if up == self._up:
            return
        self._up = up
        self._metrics.up.set(1 if up else 0)
        if up:
            logger.warning("prefix index sharing resumed: Redis answers again")
        else:
            logger.warning(
                "prefix index sharing stopped: Redis unreachable; each instance routes on its own prefix "
                "index until it answers (llm_gateway_prefix_index_sharing_up 0)"
            )

    async def _run(self) -> None:
        while True:
            more = False
            try:
                more = await self.sync()
            except Exception:  # a script or codec bug must not end the loop: log it, count it, go on
                logger.exception("prefix index sync failed")
                self._metrics.sync_errors.inc()
            if not more:
                await self._pause()

    async def _pause(self) -> None:
        """`interval_s` (`OUTAGE_RETRY_S` while Redis is unreachable); after `QUIET_SYNCS` quiet syncs,
        doubling up to `idle_interval_s` unless a local record wakes the loop (module docstring)."""
        doublings = self._quiet_syncs - QUIET_SYNCS + 1
        if not self._up or doublings <= 0:
            return await asyncio.sleep(
                self._interval_s if self._up else max(self._interval_s, OUTAGE_RETRY_S)
            )
        self._wake.clear()
        self._dozing = True
        with contextlib.suppress(TimeoutError):
            delay_s = min(self._idle_interval_s, self._interval_s * 2 ** min(doublings, 32))
            await asyncio.wait_for(self._wake.wait(), delay_s)
        self._dozing = False
