"""Two pools (two models) naming the same engine address, with different `max_concurrency_per_replica`,
on the real Redis: each pool's slots on that replica are their own lease set, so each pool gets its own
cap, also across gateway instances."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from admission.leases import LeaseScope
from admission.redis_leases import RedisLeaseStore
from core.clock import FakeClock
from tests.unit.gateway.test_slot_credits import SHARED_CAPS, SHARED_RID, Instance, shared_address_instance

from .conftest import BackendFactory

pytestmark = pytest.mark.redis


def inflight(instances: list[dict[str, Instance]], model: str) -> int:
    return sum(inst[model].inflight(SHARED_RID) for inst in instances)


async def test_pools_on_the_same_engine_address_each_get_their_own_cap_across_instances(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=1000.0)
    backends = [make_backend(script_time=clock, clock=clock) for _ in range(2)]
    one, two = (
        shared_address_instance(RedisLeaseStore(backend, LeaseScope.REPLICA), clock, backend)
        for backend in backends
    )
    keys = {model: f"{key_prefix}lease:replica:{model}@{SHARED_RID}" for model in SHARED_CAPS}

    for pool in one.values():
        await pool.submit(3)
    await one["pool-a"].step()  # one refiller round for both pools of the instance
    await one["pool-b"].collect()
    assert [len(one[model].grants) for model in SHARED_CAPS] == [1, 2]  # A holds 1 and B 2, together
    assert {model: await raw_redis.zcard(key) for model, key in keys.items()} == SHARED_CAPS
    lease_keys = {key async for key in raw_redis.scan_iter(match=f"{key_prefix}lease:replica:*@*")}
    assert lease_keys == set(keys.values())  # readable, one per pool and replica, none per address alone

    for pool in two.values():  # a second instance: each cap holds in total, per pool
        await pool.submit(3)
    served = dict.fromkeys(SHARED_CAPS, 0)
    for _ in range(30):
        for inst in (one, two):
            await inst["pool-a"].step()
            await inst["pool-b"].collect()
        for model, cap in SHARED_CAPS.items():
            assert inflight([one, two], model) <= cap
            assert await raw_redis.zcard(keys[model]) <= cap
        clock.advance(0.1)
        for inst in (one, two):
            for model, pool in inst.items():
                served[model] += len(pool.grants)
                await pool.finish(len(pool.grants))
    assert served == {model: 6 for model in SHARED_CAPS}  # every request of both instances ran
    for inst in (one, two):
        await inst["pool-a"].credits.aclose()
    assert [await raw_redis.exists(key) for key in keys.values()] == [0, 0]
