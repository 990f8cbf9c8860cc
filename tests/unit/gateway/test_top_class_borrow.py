"""The top class takes the lowest class's place under a learned cap: `critical` is not refused while
`batch` runs (`admission.lowest_class_reserve`, "The top class")."""

from __future__ import annotations

from admission.tenants import Tenant
from admission.ticket import AdmissionRequest
from gateway.upstream.slot import Slot
from router.keys import build_routing_request
from router.types import CapTier
from tests.unit.gateway.test_lowest_class_reserve_claims import MODEL, one_replica_pool
from tests.unit.gateway.test_replica_cost import engine_sample, registry

TENANT = Tenant("t")
TIERS = {"critical": CapTier.TOP, "interactive": CapTier.PLAIN, "batch": CapTier.LOWEST}


def request(priority: str) -> AdmissionRequest:
    routing = build_routing_request(MODEL, f"a {priority} prompt", cap_tier=TIERS[priority])
    return AdmissionRequest(TENANT, priority, 100, routing)


async def test_critical_runs_above_the_cap_by_the_batch_requests_there_and_no_further() -> None:
    admission, replica = one_replica_pool(reserve=0.0)  # learned cap 50
    replica.inflight_requests = 45
    batch = [admission.try_dispatch(request("batch")) for _ in range(5)]
    assert all(isinstance(slot, Slot) for slot in batch)
    assert (replica.inflight_requests, replica.lowest_class_inflight) == (50, 5)
    assert admission.try_dispatch(request("interactive")) is None, "the cap is full for the middle class"
    critical = [admission.try_dispatch(request("critical")) for _ in range(6)]
    assert all(isinstance(slot, Slot) for slot in critical[:5]), "critical takes the 5 places batch holds"
    assert critical[5] is None, "and no more than those"
    assert admission.slots_over_caps(request("critical")) == 0
    assert admission.slots_over_caps(request("interactive")) == 5, "the middle class waits for them first"
    for slot in batch:
        assert slot is not None
        slot.release()
        slot.release()  # idempotent: counted off once
    assert (replica.inflight_requests, replica.lowest_class_inflight) == (50, 0)
    assert admission.try_dispatch(request("critical")) is None, "no batch left to take the place of"
    for slot in critical[:5]:
        assert slot is not None
        slot.release()
    assert (replica.inflight_requests, replica.lowest_class_inflight) == (45, 0)


async def test_a_configured_cap_is_not_borrowed_against() -> None:
    admission, replica = one_replica_pool(reserve=0.0)
    replica.max_concurrency = 50
    replica.inflight_requests = 48
    batch = [admission.try_dispatch(request("batch")) for _ in range(2)]
    assert replica.lowest_class_inflight == 2
    assert admission.try_dispatch(request("critical")) is None, "the operator's cap of 50 holds"
    for slot in batch:
        assert slot is not None
        slot.release()


async def test_without_a_learned_cap_nothing_changes() -> None:
    _, replica = one_replica_pool(reserve=0.0)
    replica.cost.learned_cap = None
    assert replica.effective_max_concurrency(borrow=True) is None
    replica.max_concurrency = 4
    replica.lowest_class_inflight = 3
    assert replica.effective_max_concurrency(borrow=True) == 4


async def test_shared_credits_bound_the_borrow_and_closed_credits_admit_nothing() -> None:
    admission, replica = one_replica_pool(reserve=0.0)  # learned cap 50
    replica.max_concurrency = 60  # credits exist only under a configured cap: the lease cap in Redis
    credits = 20
    replica.credit_limit = lambda: credits  # this instance's credits
    replica.inflight_requests = 17
    batch = [admission.try_dispatch(request("batch")) for _ in range(3)]
    assert replica.lowest_class_inflight == 3 and replica.inflight_requests == 20
    assert admission.try_dispatch(request("critical")) is None, "the credits bound every instance's sum"
    credits = 0  # fail_closed with Redis down
    assert replica.effective_max_concurrency(borrow=True) == 0
    for slot in batch:
        assert slot is not None
        slot.release()
    assert (replica.inflight_requests, replica.lowest_class_inflight) == (17, 0)


def test_behind_several_instances_critical_takes_the_places_every_instance_s_batch_holds() -> None:
    _, replica, _ = registry(slo={"tpot_s": 0.05})  # set point 40 ms
    replica.inflight_requests = 30
    replica.engine_sampled(engine_sample(running=100, token_latency_s=0.08))
    cap = replica.cost.learned_cap
    assert cap is not None and replica.cost.foreign_requests == 70, "the others run 70 of the engine's 100"
    replica.lowest_class_inflight = 5
    assert replica.effective_max_concurrency(borrow=True) == cap - 70 + 5, "memory state: its own 5 only"
    replica.foreign_lowest_class = 20  # the other instances' batch requests there (shared state)
    assert replica.effective_max_concurrency(borrow=True) == cap - 70 + 25, "the engine's 25 places"
    assert replica.effective_max_concurrency() == cap - 70, "the other classes still see the cap"
    replica.foreign_lowest_class = 500  # a count ahead of the scrape: never more than the others run
    assert replica.effective_max_concurrency(borrow=True) == cap + 5
    replica.engine_sampled(None)  # stale samples: the others' requests no longer come off the cap
    assert replica.effective_max_concurrency(borrow=True) == cap + 5, "so none of theirs is lent either"
    replica.engine_sampled(engine_sample(running=141))  # the others run 111: 30 over the cap by themselves
    assert replica.cost.foreign_requests == 111 and replica.cost.learned_cap == cap
    replica.foreign_lowest_class = 20
    assert replica.effective_max_concurrency(borrow=True) == 0, "their batch places do not cover their excess"
    replica.foreign_lowest_class = 35
    assert replica.effective_max_concurrency(borrow=True) == cap - 111 + 40, "what is left of them is lent"
