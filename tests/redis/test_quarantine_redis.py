"""The quarantine shared through Redis: one instance quarantines, the others refuse after a sync."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from core.clock import FakeClock
from gateway.proxy.stores.quarantine_redis import RedisQuarantine
from tests.redis.conftest import CLOSED_PORT_URL, BackendFactory

pytestmark = pytest.mark.redis


async def test_a_quarantine_reaches_every_instance_at_its_next_sync(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=0.0)
    one = RedisQuarantine(make_backend(), "m", clock, ttl_s=30.0, max_entries=100)
    two = RedisQuarantine(make_backend(), "m", clock, ttl_s=30.0, max_entries=100)
    other_pool = RedisQuarantine(make_backend(), "other", clock, ttl_s=30.0, max_entries=100)
    await one.add("poison")
    assert one.contains("poison"), "refused here at once"
    assert not two.contains("poison"), "the other instance has not synced yet"
    assert await two.sync() and await other_pool.sync()
    assert two.contains("poison") and two.active
    assert not other_pool.contains("poison"), "per pool"
    ttl_ms = await raw_redis.pttl(f"{key_prefix}quarantine:m")
    assert 30_000 <= ttl_ms <= 31_000


async def test_the_set_keeps_at_most_max_entries(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=0.0)
    store = RedisQuarantine(make_backend(), "m", clock, ttl_s=30.0, max_entries=2)
    for key in ("a", "b", "c"):
        await store.add(key)
    assert await raw_redis.zcard(f"{key_prefix}quarantine:m") == 2


async def test_redis_down_still_quarantines_locally_and_keeps_the_mirror(
    make_backend: BackendFactory,
) -> None:
    clock = FakeClock(start_s=0.0)
    errors: list[object] = []
    store = RedisQuarantine(
        make_backend(CLOSED_PORT_URL, on_error_callback=errors.append), "m", clock, ttl_s=30.0, max_entries=10
    )
    await store.add("poison")
    assert store.contains("poison") and errors, "counted as a state error, quarantined locally anyway"
    assert not await store.sync()
    assert store.contains("poison"), "a failed sync keeps the mirror"
