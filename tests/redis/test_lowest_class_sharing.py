"""The lowest class's requests per replica, summed over gateway instances through the real Redis: each
instance sees the others' counts (not its own), an instance that stops counts for nothing after the
ttl, one that leaves at once, and an unreachable Redis leaves every instance with its own count only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from core.clock import FakeClock
from core.shared_state import RedisBackend
from gateway.app import GatewayApp
from gateway.config.settings import parse_settings
from gateway.fleet.lowest_class_sharing import TTL_S, LowestClassSharing, sum_counts

from .conftest import CLOSED_PORT_URL, REDIS_URL, BackendFactory

pytestmark = pytest.mark.redis

POOL = "sharing-model"


@dataclass
class FakeReplica:
    lowest_class_inflight: int = 0
    foreign_lowest_class: int = 0


@dataclass
class FakePool:
    replicas: dict[str, FakeReplica] = field(
        default_factory=lambda: {"10.0.0.1:8000": FakeReplica(), "10.0.0.2:8000": FakeReplica()}
    )


def instance(
    backend: RedisBackend, name: str, on_more: Callable[[], None] | None = None
) -> tuple[LowestClassSharing, FakePool]:
    pool = FakePool()
    return LowestClassSharing(backend, {POOL: pool}, name, on_more=on_more), pool


def foreign(pool: FakePool) -> list[int]:
    return [replica.foreign_lowest_class for replica in pool.replicas.values()]


async def test_each_instance_sees_the_sum_of_the_others_counts(make_backend: BackendFactory) -> None:
    clock = FakeClock(start_s=1000.0)
    (a, pool_a), (b, pool_b), (c, pool_c) = (
        instance(make_backend(script_time=clock), name) for name in ("a", "b", "c")
    )
    pool_a.replicas["10.0.0.1:8000"].lowest_class_inflight = 2
    pool_b.replicas["10.0.0.1:8000"].lowest_class_inflight = 3
    pool_b.replicas["10.0.0.2:8000"].lowest_class_inflight = 1
    assert await a.sync_once(), "its own batch request runs"
    assert foreign(pool_a) == [0, 0], "nobody else has said anything yet"
    assert await b.sync_once()
    assert foreign(pool_b) == [2, 0]
    assert await c.sync_once(), "the others' requests run"
    assert foreign(pool_c) == [5, 1]
    assert await a.sync_once()
    assert foreign(pool_a) == [3, 1], "never its own"
    pool_b.replicas["10.0.0.1:8000"].lowest_class_inflight = 0
    pool_b.replicas["10.0.0.2:8000"].lowest_class_inflight = 0
    await b.sync_once()
    await c.sync_once()
    assert foreign(pool_c) == [2, 0], "a count that went back to 0 counts for nothing"


async def test_an_instance_that_stops_counts_for_nothing_after_the_ttl_and_one_that_leaves_at_once(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=1000.0)
    (a, pool_a), (b, pool_b), (c, pool_c) = (
        instance(make_backend(script_time=clock), name) for name in ("a", "b", "c")
    )
    pool_b.replicas["10.0.0.1:8000"].lowest_class_inflight = 4
    pool_c.replicas["10.0.0.2:8000"].lowest_class_inflight = 6
    for sharing in (a, b, c):
        await sharing.sync_once()
    await a.sync_once()
    assert foreign(pool_a) == [4, 6]
    await c.stop()  # a graceful stop removes its field
    assert foreign(pool_c) == [0, 0]
    await a.sync_once()
    assert foreign(pool_a) == [4, 0]
    clock.advance(TTL_S + 0.1)  # b was killed: it stopped exchanging without a goodbye
    assert not await a.sync_once(), "no lowest-class request runs anywhere now"
    assert foreign(pool_a) == [0, 0]
    key = f"{key_prefix}lowest-class:{POOL}"
    assert await raw_redis.hkeys(key) == ["a"], "the dead instance's field was deleted"
    assert 0 < await raw_redis.pttl(key) <= (TTL_S + 1) * 1000, "the hash expires when everyone stops"


async def test_redis_unreachable_leaves_each_instance_its_own_count_only(
    make_backend: BackendFactory,
) -> None:
    sharing, pool = instance(make_backend(CLOSED_PORT_URL), "a")
    pool.replicas["10.0.0.1:8000"].lowest_class_inflight = 3
    pool.replicas["10.0.0.1:8000"].foreign_lowest_class = 7  # from before the outage
    assert not await sharing.sync_once()
    assert foreign(pool) == [0, 0], "the side on which the cap holds: nothing lent from the others"
    await sharing.stop()  # and stopping without Redis does not fail


async def test_the_loop_runs_until_stopped(make_backend: BackendFactory) -> None:
    a, pool_a = instance(make_backend(), "a")
    b, pool_b = instance(make_backend(), "b")
    pool_a.replicas["10.0.0.2:8000"].lowest_class_inflight = 2
    a.start()
    b.start()
    try:
        for _ in range(100):
            if foreign(pool_b) == [0, 2]:
                break
            await asyncio.sleep(0.05)
        assert foreign(pool_b) == [0, 2]
    finally:
        await a.stop()
        await b.stop()


def test_a_malformed_payload_counts_for_nothing() -> None:
    assert sum_counts(['{"r1": 2}', "not json", "[1, 2]", '{"r1": "3", "r2": -1, "r3": 4}']) == {
        "r1": 2,
        "r3": 4,
    }


@pytest.mark.parametrize(
    ("classes", "adaptive_cap", "exchanged"),
    [
        (None, True, True),  # the default classes (critical, interactive, batch), a learned cap
        ({"only": {"max_wait_s": 5}}, True, False),  # one class: no lowest class to count
        (None, False, False),  # no learned cap: no place to lend
    ],
)
async def test_a_gateway_on_redis_state_exchanges_its_counts_with_several_classes_and_a_learned_cap(
    raw_redis: Redis, key_prefix: str, classes: dict[str, Any] | None, adaptive_cap: bool, exchanged: bool
) -> None:
    admission: dict[str, Any] = {} if classes is None else {"classes": classes, "default_priority": "only"}
    pool = {
        "model": POOL,
        "replicas": {"static": ["http://127.0.0.1:1"]},
        "latency_model": {"adaptive_cap": adaptive_cap},
    }
    raw = {
        "state": {"backend": "redis", "url": REDIS_URL, "key_prefix": key_prefix},
        "admission": admission,
        "pools": [pool],
    }
    app = GatewayApp(parse_settings(raw))
    await app.startup()
    try:
        key = f"{key_prefix}lowest-class:{POOL}"
        for _ in range(40):
            if await raw_redis.exists(key):
                break
            await asyncio.sleep(0.025)
        assert bool(await raw_redis.exists(key)) is exchanged
    finally:
        await app.shutdown()
    assert not await raw_redis.exists(key), "a graceful stop removes its field"


async def test_a_count_that_grew_lets_admission_look_at_its_waiters_again(
    make_backend: BackendFactory,
) -> None:
    clock = FakeClock(start_s=1000.0)
    woken: list[int] = []
    (a, pool_a), (b, _) = (
        instance(make_backend(script_time=clock), "a"),
        instance(make_backend(script_time=clock), "b", on_more=lambda: woken.append(1)),
    )
    pool_a.replicas["10.0.0.2:8000"].lowest_class_inflight = 2
    await a.sync_once()
    await b.sync_once()
    assert len(woken) == 1, "the top class's waiters may fit: 2 more places on 10.0.0.2"
    await b.sync_once()
    assert len(woken) == 1, "nothing grew"
    pool_a.replicas["10.0.0.2:8000"].lowest_class_inflight = 1
    await a.sync_once()
    await b.sync_once()
    assert len(woken) == 1, "fewer places: nobody new fits"


async def test_a_failing_exchange_lends_nothing_and_stopping_does_not_raise(
    make_backend: BackendFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors: list[int] = []
    backend = make_backend()
    a, pool_a = instance(make_backend(), "a")
    b = LowestClassSharing(
        backend, {POOL: (pool_b := FakePool())}, "b", on_loop_error=lambda: errors.append(1)
    )
    pool_a.replicas["10.0.0.1:8000"].lowest_class_inflight = 4
    await a.sync_once()
    await b.sync_once()
    assert foreign(pool_b) == [4, 0]

    async def out_of_memory(*_: Any) -> Any:
        raise ResponseError("OOM command not allowed when used memory > 'maxmemory'")

    monkeypatch.setattr(backend, "run", out_of_memory)  # reachable, but every script fails
    b.start()
    for _ in range(100):
        if errors:
            break
        await asyncio.sleep(0.01)
    assert errors and foreign(pool_b) == [0, 0], "counts it could not refresh are not lent"
    await b.stop()
    assert len(errors) == 2, "the failed goodbye is logged and counted, not raised"
    await a.stop()
