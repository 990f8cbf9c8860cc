"""Slot credits (gateway.upstream.slot_credits) on a memory lease store and a fake clock: gateway
instances share one store, each with its real registry, dispatcher and admission controller; the
refiller is stepped by hand (`SlotCredits.step`), nothing sleeps."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest

from admission.controller import AdmissionController
from admission.leases import Lease, LeaseScope, LeaseStore, MemoryLeaseStore
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest, Ticket
from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.admission_assembly import build_admission
from gateway.proxy.route import Router
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.slot import Slot
from gateway.upstream.slot_credit_ledger import PRESENCE_PREFIX, CreditMode, StateHealth, slot_resource_id
from gateway.upstream.slot_credits import SlotCredits
from router.types import RoutingRequest
from tests.servers import gateway_settings

MODEL = "m"
URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
RIDS = ["10.0.0.1:8000", "10.0.0.2:8000"]
TTL_S = 3.0
LINGER_S = 1.0
SHARED_URL, SHARED_RID = "http://10.0.0.9:8000", "10.0.0.9:8000"
SHARED_CAPS = {"pool-a": 1, "pool-b": 2}


def slots(rid: str, model: str = MODEL) -> str:
    """The lease resource of `model`'s slots on replica `rid`."""
    return slot_resource_id(model, rid)


class FlakyStore:
    """A memory lease store that can be "unreachable", answering like `RedisLeaseStore` then; it is
    also the `StateHealth` of the credits."""

    def __init__(self, clock: FakeClock, fail_open: bool = True) -> None:
        self.inner = MemoryLeaseStore(clock, LeaseScope.REPLICA)
        self.fail_open = fail_open
        self.down = False
        self.available = True
        self.calls = 0

    @property
    def scope(self) -> LeaseScope:
        return LeaseScope.REPLICA

    def _reach(self) -> bool:
        self.calls += 1
        self.available = not self.down
        return self.available

    async def acquire(self, resource_id: str, cap: int, ttl_s: float) -> Lease | None:
        if not self._reach():
            return (
                Lease(LeaseScope.REPLICA, resource_id, "x", ttl_s, degraded=True) if self.fail_open else None
            )
        return await self.inner.acquire(resource_id, cap, ttl_s)

    async def renew(self, lease: Lease) -> bool:
        if not self._reach():
            return self.fail_open
        return await self.inner.renew(lease)

    async def release(self, lease: Lease) -> bool:
        return await self.inner.release(lease) if self._reach() else False

    async def count(self, resource_id: str) -> int:
        return await self.inner.count(resource_id) if self._reach() else 0


@dataclass
class Instance:
    """One gateway instance: registry, controller and credits on the shared store."""

    registry: ReplicaRegistry
    pool: Pool
    controller: AdmissionController[Slot]
    credits: SlotCredits
    waiting: list[asyncio.Task[Ticket[Slot]]] = field(default_factory=list)
    grants: list[Ticket[Slot]] = field(default_factory=list)

    def inflight(self, rid: str) -> int:
        return self.pool.replicas[rid].inflight_requests

    def held(self, rid: str) -> int:
        return self.credits.held(self.pool.model, rid)

    async def submit(self, count: int) -> None:
        for _ in range(count):
            request = AdmissionRequest(Tenant("t"), "interactive", 0, RoutingRequest(model=self.pool.model))
            self.waiting.append(asyncio.create_task(self.controller.admit(request)))
        await settle()

    async def step(self) -> None:
        await self.credits.step()
        await self.collect()

    async def collect(self) -> None:
        await settle()
        for task in [t for t in self.waiting if t.done()]:
            self.waiting.remove(task)
            self.grants.append(task.result())

    async def finish(self, count: int = 1) -> None:
        for grant in self.grants[:count]:
            await grant.release()
        del self.grants[:count]
        await self.collect()

    def check_invariant(self) -> None:
        for rid in RIDS:
            replica = self.pool.replicas[rid]
            assert replica.view(0.0).max_concurrency is not None
            if self.credits.mode is CreditMode.SHARED:
                assert self.inflight(rid) <= self.held(rid) <= 2


async def total(store: MemoryLeaseStore) -> int:
    return sum([await store.count(slots(rid)) for rid in RIDS])


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def instance(
    store: LeaseStore, clock: FakeClock, health: StateHealth | None = None, cap: int = 2
) -> Instance:
    pools = [{"model": MODEL, "replicas": {"static": URLS}, "max_concurrency_per_replica": cap}]
    return instance_pools(store, clock, health, pools)[MODEL]


def shared_address_instance(
    store: LeaseStore, clock: FakeClock, health: StateHealth | None = None
) -> dict[str, Instance]:
    """One gateway instance whose pools (`SHARED_CAPS`: model → cap) all name the engine `SHARED_URL`;
    the `Instance`s share its registry and credits (step the credits once, then collect each pool)."""
    pools = [
        {"model": model, "replicas": {"static": [SHARED_URL]}, "max_concurrency_per_replica": cap}
        for model, cap in SHARED_CAPS.items()
    ]
    return instance_pools(store, clock, health, pools)


def instance_pools(
    store: LeaseStore, clock: FakeClock, health: StateHealth | None, pools: list[dict[str, object]]
) -> dict[str, Instance]:
    # These tests step a fake clock past the TTFT objective's bound on queue waits: queue by class only.
    pools = [{"slo": {"queue_wait_ratio": None}, **pool} for pool in pools]
    settings = parse_settings(gateway_settings(pools))
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(settings, metrics, clock, random.Random(0))
    credits = SlotCredits(
        store,
        health or _Up(),
        clock,
        ttl_s=TTL_S,
        linger_s=LINGER_S,
        autostart=False,
    )
    admission = build_admission(
        settings,
        registry=registry,
        router=Router(metrics),
        gate=TenantGate.in_memory(clock),
        clock=clock,
        metrics=metrics,
        credits=credits,
    )
    return {
        model: Instance(registry, registry.pools[model], admission.pool(model).controller, credits)
        for model in registry.pools
    }


class _Up:
    available = True
    fail_open = True


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=100.0)


@pytest.fixture
def store(clock: FakeClock) -> MemoryLeaseStore:
    return MemoryLeaseStore(clock, LeaseScope.REPLICA)


async def test_a_replica_without_a_credit_is_not_routable_until_one_is_acquired_on_demand(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    one = instance(store, clock)
    assert [one.pool.replicas[rid].view(clock.now_s()).max_concurrency for rid in RIDS] == [0, 0]
    await one.submit(1)
    assert len(one.controller) == 1 and not one.grants  # queued: no credit yet
    await one.step()
    assert len(one.grants) == 1 and len(one.controller) == 0
    busy = one.grants[0].slot().decision.replica_id
    assert one.inflight(busy) == 1
    assert one.held(busy) == 2  # the occupied credit and the spare
    other = next(rid for rid in RIDS if rid != busy)
    assert one.held(other) == 1  # a spare, so routing keeps its choice
    assert await store.count(slots(busy)) == 2 and await store.count(slots(other)) == 1
    one.check_invariant()


async def test_in_flight_requests_never_exceed_the_credits_held(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    one = instance(store, clock)
    await one.submit(10)
    for _ in range(3):
        await one.step()
        one.check_invariant()
    assert len(one.grants) == 4 and len(one.controller) == 6  # two replicas of cap 2
    await one.finish(1)  # its credit is reused at once by a waiter
    assert len(one.grants) == 4 and len(one.controller) == 5
    one.check_invariant()
    assert await total(store) == 4


async def test_idle_credits_go_back_after_the_linger_and_renewals_keep_busy_ones(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    one = instance(store, clock)
    await one.submit(2)
    await one.step()
    await one.finish(1)
    for _ in range(6):  # 6 s = 2 ttl: the one running request's credit is renewed every ttl / 3
        clock.advance(TTL_S / 3)
        await one.step()
        one.check_invariant()
    busy = one.grants[0].slot().decision.replica_id
    assert await store.count(slots(busy)) == 1 and one.held(busy) == 1
    assert one.credits.link.leases_lost_total == 0
    await one.finish(1)
    clock.advance(LINGER_S)
    await one.step()
    assert await total(store) == 0
    assert sum(one.held(rid) for rid in RIDS) == 0


async def test_a_lease_that_expired_during_a_stall_is_dropped_and_the_replica_fills_no_further(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    one = instance(store, clock)
    await one.submit(1)
    await one.step()
    busy = one.grants[0].slot().decision.replica_id
    clock.advance(TTL_S + 1)  # no renewal happened: the instance was stalled
    await one.step()
    assert one.credits.link.leases_lost_total >= 1
    assert one.inflight(busy) == 1
    assert one.held(busy) == 0 and not one.pool.replicas[busy].view(clock.now_s()).has_free_slot


async def test_the_cap_holds_across_instances_and_both_get_served(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    one, two = instance(store, clock), instance(store, clock)
    await one.submit(30)
    await one.step()
    assert len(one.grants) == 4  # first come: all four slots
    await two.submit(30)
    for _ in range(40):
        for inst in (one, two):
            await inst.step()
            inst.check_invariant()
        for rid in RIDS:
            assert one.inflight(rid) + two.inflight(rid) <= 2
            assert await store.count(slots(rid)) <= 2
        clock.advance(0.1)
        for inst in (one, two):
            await inst.finish(1)
    served = [30 - len(one.waiting) - len(one.grants), 30 - len(two.waiting) - len(two.grants)]
    assert min(served) >= 10, served  # the late instance gets its share (no hoarding)
    assert await store.count(PRESENCE_PREFIX + MODEL) >= 1  # the late one registered as starving


async def test_the_slots_of_an_instance_that_died_are_reclaimed_after_the_ttl(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    dead, survivor = instance(store, clock), instance(store, clock)
    await dead.submit(4)
    await dead.step()
    assert len(dead.grants) == 4  # then it is killed: no renewal, no release
    await survivor.submit(2)
    await survivor.step()
    assert not survivor.grants
    clock.advance(TTL_S)
    await survivor.step()
    assert len(survivor.grants) == 2


async def test_fail_open_falls_back_to_the_local_cap_and_recovers(clock: FakeClock) -> None:
    store = FlakyStore(clock, fail_open=True)
    one = instance(store, clock, health=store)
    store.down = True
    await one.submit(5)
    await one.step()
    assert one.credits.mode is CreditMode.LOCAL
    assert len(one.grants) == 4  # each replica's own cap of 2, without credits
    assert sum(one.held(rid) for rid in RIDS) == 0
    store.down = False
    await one.finish(4)  # the waiter takes a freed local slot
    await one.finish(1)
    clock.advance(1.0)  # the next probe
    await one.step()
    assert one.credits.mode is CreditMode.SHARED
    one.check_invariant()
    await one.submit(1)
    await one.step()
    assert len(one.grants) == 1 and sum(one.held(rid) for rid in RIDS) >= 1


async def test_fail_closed_dispatches_nothing_new_until_the_store_answers(clock: FakeClock) -> None:
    store = FlakyStore(clock, fail_open=False)
    one = instance(store, clock, health=store)
    await one.submit(1)
    await one.step()
    assert len(one.grants) == 1
    store.down = True
    clock.advance(TTL_S / 3)
    await one.step()  # the renewal finds the store down
    assert one.credits.mode is CreditMode.CLOSED
    assert [one.pool.replicas[rid].view(clock.now_s()).max_concurrency for rid in RIDS] == [0, 0]
    await one.submit(2)
    await one.step()
    assert len(one.grants) == 1 and len(one.controller) == 2
    calls = store.calls
    await one.step()
    assert store.calls == calls  # no hammering: only a probe every second
    store.down = False
    clock.advance(1.0)
    await one.step()
    assert one.credits.mode is CreditMode.SHARED and len(one.grants) == 3
    assert one.credits.link.leases_lost_total == 0  # renewed as soon as the store answered
    one.check_invariant()


async def test_close_gives_every_credit_back(clock: FakeClock, store: MemoryLeaseStore) -> None:
    one = instance(store, clock)
    await one.submit(3)
    await one.step()
    await one.finish(3)
    assert await total(store) > 0
    await one.credits.aclose()
    assert await total(store) == 0


async def test_a_replica_added_by_discovery_is_governed_before_its_first_dispatch(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    one = instance(store, clock)
    added = one.pool.add_replica("http://10.0.0.3:8000")
    assert added.view(clock.now_s()).max_concurrency == 2  # not yet seen by the credits
    await one.submit(1)  # the claim syncs first: no credit, so it waits
    assert not one.grants and added.view(clock.now_s()).max_concurrency == 0
    await one.step()
    assert len(one.grants) == 1


def test_state_settings_for_shared_caps() -> None:
    settings = parse_settings(
        {
            "state": {
                "backend": "redis",
                "key_prefix": "t:",
                "replica_lease_ttl_s": 2,
                "replica_credit_linger_s": 0.5,
            }
        }
    )
    assert settings.state.key_prefix == "t:"
    assert settings.state.replica_lease_ttl_s == 2.0 and settings.state.replica_credit_linger_s == 0.5
    assert parse_settings({}).state.key_prefix == "llm-gateway:"


async def test_three_starving_instances_share_the_slots_fairly(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """Cap 4 per replica, three instances with long queues: shares of 1 plus one floating credit that
    rotates. Requests last 0.3 s; the refillers run in a (seeded) random order every 50 ms."""
    order = random.Random(5)
    instances = [instance(store, clock, cap=4) for _ in range(3)]
    for inst in instances:
        await inst.submit(300)
    started: dict[Ticket[Slot], float] = {}
    served = [0, 0, 0]
    for _ in range(200):
        for inst in order.sample(instances, 3):
            await inst.step()
        for rid in RIDS:
            assert sum(inst.inflight(rid) for inst in instances) <= 4
            assert await store.count(slots(rid)) <= 4
        clock.advance(0.05)
        for n, inst in enumerate(instances):
            for grant in list(inst.grants):
                if clock.now_s() - started.setdefault(grant, clock.now_s()) >= 0.3:
                    inst.grants.remove(grant)
                    await grant.release()
                    served[n] += 1
            await inst.collect()
    assert min(served) >= 0.25 * sum(served), served
    assert sum(served) >= 180, served  # one instance alone serves 200 here: ≥ 90 % of that


async def test_pools_naming_the_same_engine_address_each_hold_their_own_cap(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """Pool A (cap 1) and pool B (cap 2) on one engine address: separate leases, each pool its own cap."""
    one = shared_address_instance(store, clock)
    for pool in one.values():
        await pool.submit(3)
    await one["pool-a"].step()
    await one["pool-b"].collect()
    assert [len(one[model].grants) for model in SHARED_CAPS] == [1, 2]  # at the same time
    assert [await store.count(slots(SHARED_RID, model)) for model in SHARED_CAPS] == [1, 2]
    assert await store.count(SHARED_RID) == 0  # no lease keyed by the address alone


async def test_a_pool_without_a_configured_cap_judges_its_first_arrival_at_arrival(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """Credits govern only capped replicas, so in a pool without `max_concurrency_per_replica` a queued
    request asks Redis for nothing: early refusal answers an arrival that would be first in line (found
    behind three instances sharing state: interactive arrivals first in line when learned caps were cut
    queued into a `queue_timeout` 2 s later instead of a 429 at arrival)."""
    pools = instance_pools(
        store,
        clock,
        None,
        [
            {"model": "capped", "replicas": {"static": URLS}, "max_concurrency_per_replica": 2},
            {"model": "uncapped", "replicas": {"static": ["http://10.0.0.3:8000"]}},
        ],
    )
    assert pools["capped"].controller._config.early_refusal_needs_queue
    assert not pools["uncapped"].controller._config.early_refusal_needs_queue


async def test_after_an_idle_period_an_arrival_queues_for_a_credit_instead_of_being_refused(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """Found by review: early refusal (on by default) judged an instance that holds no credit by its
    decayed dispatch rate and refused every arrival — and, as nothing queued, no credit was ever
    asked for again. With shared credits an arrival that would be first in line queues, and one that
    finds the controller holding no grant of its own never gets an early refusal."""
    one = instance(store, clock)
    assert one.controller._config.early_refusal_ratio is not None
    assert one.controller._config.early_refusal_needs_queue, "build_admission sets it with credits"
    await one.submit(1)
    await one.step()
    await one.finish()
    for _ in range(5):  # 120 s idle: the credits go back after the linger
        clock.advance(24.0)
        await one.step()
    assert one.held(RIDS[0]) + one.held(RIDS[1]) == 0
    await one.submit(2)
    assert len(one.controller) == 2, "both queued (no grant held: nothing to predict from)"
    await one.step()
    assert len(one.grants) == 2 and not one.waiting
    await one.finish(2)
