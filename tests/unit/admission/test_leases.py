import itertools

import pytest

from admission.leases import Lease, LeaseScope, MemoryLeaseStore, random_lease_id
from core.clock import FakeClock


def make_store(clock: FakeClock, scope: LeaseScope = LeaseScope.REPLICA) -> MemoryLeaseStore:
    counter = itertools.count()
    return MemoryLeaseStore(clock, scope, id_factory=lambda: f"lease-{next(counter)}")


async def test_cap_is_enforced_and_release_frees_a_slot() -> None:
    store = make_store(FakeClock())
    leases = [await store.acquire("r1", cap=3, ttl_s=10.0) for _ in range(3)]
    assert all(lease is not None for lease in leases)
    assert await store.acquire("r1", cap=3, ttl_s=10.0) is None
    assert await store.count("r1") == 3
    assert await store.acquire("r2", cap=3, ttl_s=10.0) is not None  # other resource
    first = leases[0]
    assert first is not None
    assert first.lease_id == "lease-0" and first.scope is LeaseScope.REPLICA and first.resource_id == "r1"
    assert await store.release(first)
    assert not await store.release(first)
    assert await store.count("r1") == 2
    assert await store.acquire("r1", cap=3, ttl_s=10.0) is not None


async def test_expired_leases_are_reclaimed() -> None:
    clock = FakeClock()
    store = make_store(clock)
    dead = [await store.acquire("r1", cap=2, ttl_s=5.0) for _ in range(2)]
    assert await store.acquire("r1", cap=2, ttl_s=5.0) is None
    clock.advance(5.0)  # now == expiry: expired
    assert await store.count("r1") == 0
    assert await store.acquire("r1", cap=2, ttl_s=5.0) is not None
    for lease in dead:
        assert lease is not None
        assert not await store.renew(lease)
        assert not await store.release(lease)


async def test_renew_keeps_a_lease_alive() -> None:
    clock = FakeClock()
    store = make_store(clock)
    lease = await store.acquire("r1", cap=1, ttl_s=3.0)
    assert lease is not None
    for _ in range(5):
        clock.advance(2.0)
        assert await store.renew(lease)
    assert await store.acquire("r1", cap=1, ttl_s=3.0) is None
    assert await store.release(lease)
    assert not await store.renew(lease)


async def test_degraded_leases_are_local_no_ops() -> None:
    store = make_store(FakeClock())
    lease = Lease(LeaseScope.TENANT, "t", "x", 1.0, degraded=True)
    assert await store.renew(lease)
    assert await store.release(lease)


async def test_tenant_bulkhead_uses_the_same_primitive() -> None:
    store = make_store(FakeClock(), LeaseScope.TENANT)
    assert store.scope is LeaseScope.TENANT
    assert await store.acquire("tenant-a", cap=0, ttl_s=1.0) is None
    assert await store.acquire("tenant-a", cap=1, ttl_s=1.0) is not None


@pytest.mark.parametrize(("cap", "ttl_s"), [(-1, 1.0), (1, 0.0)])
async def test_invalid_arguments_raise(cap: int, ttl_s: float) -> None:
    with pytest.raises(ValueError):
        await make_store(FakeClock()).acquire("r", cap=cap, ttl_s=ttl_s)


def test_random_lease_ids_are_unique() -> None:
    assert len({random_lease_id() for _ in range(1000)}) == 1000
