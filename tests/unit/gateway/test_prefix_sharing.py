"""Prefix-index sharing without Redis: the record codec, the apply path (what is merged, what is ignored)
and the behaviour while the backend is unreachable, on a fake backend that keeps the stream in memory
(the Lua script itself runs against the real Redis in tests/redis/test_prefix_sharing_redis.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
from collections.abc import Sequence
from typing import Any, cast

import pytest

from core.shared_state import RedisBackend
from core.state_outage import RedisOperation
from gateway.base.metrics import GatewayMetrics
from gateway.fleet.prefix_records import IndexRecord, decode_batch, encode_batch
from gateway.fleet.prefix_sharing import (
    MAX_RECORDS_PER_BATCH,
    QUIET_SYNCS,
    PrefixIndexSharing,
    SharingMetrics,
)
from gateway.fleet.shared_state_assembly import share_prefix_indexes
from router.prefix_index import PrefixIndex
from router.presets import PolicyContext, build_policy

U64_MAX = (1 << 64) - 1


class TestCodec:
    def test_a_batch_round_trips_hashes_at_both_ends_of_64_bits_and_any_names(self) -> None:
        records = [
            IndexRecord("org/Model-8B", "10.0.0.1:8000", (0, 1, U64_MAX, 0x1234_5678_9ABC_DEF0)),
            IndexRecord("modèle ✓", "host:1", ()),
        ]
        assert decode_batch(encode_batch(records)) == records

    def test_hashes_cost_twelve_characters_per_block_and_carry_no_text(self) -> None:
        payload = encode_batch([IndexRecord("m", "r", tuple(range(136)))])
        assert len(payload) < 136 * 12 + 20
        row = json.loads(payload)[0]
        assert row[:2] == ["m", "r"] and len(base64.b64decode(row[2])) == 136 * 8

    @pytest.mark.parametrize("bad", [-1, 1 << 64])
    def test_a_hash_outside_unsigned_64_bits_is_refused(self, bad: int) -> None:
        with pytest.raises(ValueError, match="64 bits"):
            encode_batch([IndexRecord("m", "r", (1, bad))])

    @pytest.mark.parametrize(
        ("payload", "message"),
        [
            ("not json", "Expecting value"),
            ('{"m": 1}', "JSON list"),
            ('[["m", "r"]]', "pool, replica_id, hashes"),
            ('[["m", "r", 7]]', "pool, replica_id, hashes"),
            ('[["m", "r", "***"]]', "not base64"),
            ('[["m", "r", "AAAA"]]', "multiple of 8"),
        ],
    )
    def test_a_malformed_batch_is_a_value_error_naming_the_fault(self, payload: str, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            decode_batch(payload)


class FakeStream:
    """The sync script's semantics in memory: append, then the other instances' entries after last_id."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str, str]] = []
        self.down = False
        self.calls = 0

    async def run(
        self, operation: RedisOperation, script: Any, keys: Sequence[str], args: Sequence[str]
    ) -> Any:
        assert operation is RedisOperation.PREFIX_INDEX_SYNC
        self.calls += 1
        if self.down:
            return None
        _max, _ttl, last, _replay, count, me, payload = args
        if payload:
            self.entries.append((len(self.entries) + 1, me, payload))
        after = int(last or 0)
        newer = [e for e in self.entries if e[0] > after][: int(count)]
        last_id = str(newer[-1][0]) if newer else str(after)
        return [last_id, *(data for _, who, data in newer if who != me)]


class FakeBackend:
    def __init__(self, stream: FakeStream) -> None:
        self.run = stream.run

    def key(self, *parts: str) -> str:
        return "test:" + ":".join(parts)

    def register(self, source: str) -> object:
        return object()


class Instance:
    def __init__(
        self, stream: FakeStream, name: str, members: Sequence[str] = ("r0", "r1"), max_pending: int = 8
    ) -> None:
        self.index = PrefixIndex(capacity_blocks_per_replica=64)
        self.metrics = GatewayMetrics()
        self.members = set(members)
        self.sharing = PrefixIndexSharing(
            cast(RedisBackend, FakeBackend(stream)),
            {"pool-a": self.index},
            lambda pool: self.members,
            SharingMetrics(self.metrics),
            instance_id=name,
            max_pending_records=max_pending,
        )

    def count(self, direction: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "llm_gateway_prefix_index_records_total", {"direction": direction}
        )
        return value or 0.0

    def up(self) -> float | None:
        return self.metrics.registry.get_sample_value("llm_gateway_prefix_index_sharing_up")


async def test_a_record_made_on_one_instance_is_merged_into_the_other_and_not_echoed() -> None:
    stream = FakeStream()
    a, b = Instance(stream, "a"), Instance(stream, "b")
    a.index.record("r1", (1, 2, 3))
    assert a.sharing.pending == 1
    await a.sharing.sync()
    await b.sharing.sync()
    assert b.index.matched_blocks("r1", (1, 2, 3, 4)) == 3
    assert a.count("published") == 1 and b.count("applied") == 1
    assert b.sharing.pending == 0, "a merged record is not published again"
    await a.sharing.sync()
    assert a.count("applied") == 0, "an instance never applies its own records"


async def test_records_for_an_unknown_pool_or_a_replica_outside_the_pool_are_ignored() -> None:
    stream = FakeStream()
    b = Instance(stream, "b", members=("r0",))
    payload = encode_batch(
        [
            IndexRecord("pool-a", "r9", (5,)),
            IndexRecord("other-pool", "r0", (6,)),
            IndexRecord("pool-a", "r0", (7,)),
        ]
    )
    stream.entries.append((1, "a", payload))
    await b.sharing.sync()
    assert b.index.replica_ids() == ("r0",)
    assert b.count("applied") == 1 and b.count("ignored") == 2


async def test_a_malformed_batch_is_skipped_counted_and_the_next_one_applied(caplog: Any) -> None:
    stream = FakeStream()
    b = Instance(stream, "b")
    stream.entries.append((1, "a", "[not json"))
    stream.entries.append((2, "a", encode_batch([IndexRecord("pool-a", "r0", (8, 9))])))
    with caplog.at_level(logging.WARNING):
        await b.sharing.sync()
    assert b.index.matched_blocks("r0", (8, 9)) == 2
    assert b.count("ignored") == 1 and "malformed batch" in caplog.text


async def test_publishing_is_batched_one_call_per_batch_not_per_request() -> None:
    stream = FakeStream()
    a = Instance(stream, "a", max_pending=4 * MAX_RECORDS_PER_BATCH)
    for n in range(2 * MAX_RECORDS_PER_BATCH + 1):
        a.index.record("r0", (n + 1,))
    more = [await a.sharing.sync() for _ in range(3)]
    assert more == [True, False, False]  # the second leaves one record, the third publishes it
    assert stream.calls == 3 and a.count("published") == 2 * MAX_RECORDS_PER_BATCH + 1
    assert [len(decode_batch(p)) for _, _, p in stream.entries] == [MAX_RECORDS_PER_BATCH] * 2 + [1]


async def test_a_full_buffer_drops_the_oldest_records_and_counts_them() -> None:
    a = Instance(FakeStream(), "a")  # max_pending_records=8
    for n in range(11):
        a.index.record("r0", (n + 1,))
    assert a.sharing.pending == 8 and a.count("dropped") == 3


async def test_redis_down_routes_on_the_own_index_logs_once_and_resumes(caplog: Any) -> None:
    stream = FakeStream()
    a, b = Instance(stream, "a"), Instance(stream, "b")
    assert a.up() == 1
    stream.down = True
    with caplog.at_level(logging.WARNING, logger="gateway.fleet.prefix_sharing"):
        for n in range(3):
            a.index.record("r0", (n + 1,))
            await a.sharing.sync()
    assert a.index.matched_blocks("r0", (1,)) == 1, "the own index keeps working"
    assert a.up() == 0 and not a.sharing.up and a.count("dropped") == 3
    assert caplog.text.count("prefix index sharing stopped") == 1
    stream.down = False
    a.index.record("r1", (42,))
    with caplog.at_level(logging.WARNING, logger="gateway.fleet.prefix_sharing"):
        await a.sharing.sync()
        await b.sharing.sync()
    assert a.up() == 1 and "resumed" in caplog.text
    assert b.index.matched_blocks("r1", (42,)) == 1 and b.index.matched_blocks("r0", (1,)) == 0


async def test_the_loop_survives_a_failing_sync_and_stop_flushes_and_detaches(caplog: Any) -> None:
    stream = FakeStream()
    a = Instance(stream, "a")
    failures = 0
    real_sync = a.sharing.sync

    async def flaky() -> bool:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise RuntimeError("script bug")
        return await real_sync()

    a.sharing.sync = flaky  # type: ignore[method-assign]
    a.sharing._interval_s = 0.001
    with caplog.at_level(logging.ERROR):
        a.sharing.start()
        a.index.record("r0", (1, 2))
        for _ in range(200):
            if stream.entries:
                break
            await asyncio.sleep(0.005)
    assert stream.entries, "the loop published after two failures"
    errors = a.metrics.registry.get_sample_value(
        "llm_gateway_state_errors_total", {"operation": "prefix_index_sync_loop"}
    )
    assert errors == 2 and "prefix index sync failed" in caplog.text
    a.index.record("r0", (3,))
    await a.sharing.stop()
    assert a.sharing.pending == 0 and len(stream.entries) == 2, "stop publishes what was pending"
    a.index.record("r0", (4,))
    assert a.sharing.pending == 0, "after stop the index no longer hands records on"


class FakePool:
    def __init__(self, policy_name: str) -> None:
        self.policy = build_policy(policy_name, PolicyContext(rng=random.Random(1)))
        self.replicas: dict[str, object] = {"r0": object()}


async def test_sharing_starts_only_with_redis_enabled_and_an_index_to_share() -> None:
    backend = cast(RedisBackend, FakeBackend(FakeStream()))
    indexed, plain = {"m": FakePool("prefix-index")}, {"m": FakePool("least-load")}
    for args in [(None, True, indexed), (backend, False, indexed), (backend, True, plain)]:
        metrics = GatewayMetrics()
        close = share_prefix_indexes(args[0], args[1], args[2], metrics)  # type: ignore[arg-type]
        assert metrics.registry.get_sample_value("llm_gateway_prefix_index_sharing_up") is None
        await close()
    metrics = GatewayMetrics()
    close = share_prefix_indexes(backend, True, indexed, metrics)
    assert metrics.registry.get_sample_value("llm_gateway_prefix_index_sharing_up") == 1
    await close()


async def test_an_idle_instance_syncs_less_often_and_a_local_record_wakes_it_at_once() -> None:
    """After `QUIET_SYNCS` syncs that moved nothing the interval doubles up to `idle_interval_s`; a
    local record made meanwhile is published at once, and the interval is back to `interval_s`."""
    stream = FakeStream()
    a = Instance(stream, "a")
    a.sharing._interval_s = 0.002
    a.sharing._idle_interval_s = 10.0
    a.sharing.start()
    for _ in range(500):
        if a.sharing._dozing:
            break
        await asyncio.sleep(0.002)
    assert a.sharing._dozing, "quiet syncs put the loop to sleep for longer"
    calls = stream.calls
    assert calls >= QUIET_SYNCS
    await asyncio.sleep(0.1)
    assert stream.calls <= calls + 8, "doubling intervals: a handful of syncs, not fifty"
    a.index.record("r0", (7,))
    for _ in range(100):
        if stream.entries:
            break
        await asyncio.sleep(0.001)
    assert stream.entries, "the record woke the loop long before its 10 s interval"
    assert a.sharing._quiet_syncs == 0
    await a.sharing.stop()
