"""A disaggregated pool behind shared slot credits (gateway.upstream.slot_credits,
gateway.proxy.disagg.admit): its pair queue asks for credits on both sets and is woken when they come.
One gateway instance on a memory lease store and a fake clock; the refiller is stepped by hand."""

from __future__ import annotations

import asyncio
import random

import pytest

from admission.leases import LeaseScope, MemoryLeaseStore
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest, SlotRole, Ticket
from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.admission_assembly import Admission, build_admission
from gateway.proxy.disagg.admit import PairAdmission, add_pair_admissions
from gateway.proxy.route import Router
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.slot import Slot
from gateway.upstream.slot_credit_ledger import slot_resource_id
from gateway.upstream.slot_credits import SlotCredits
from router.types import RoutingRequest

MODEL = "m"
PREFILL_URL, PREFILL_RID = "http://10.0.1.1:8000", "10.0.1.1:8000"
DECODE_URL, DECODE_RID = "http://10.0.2.1:8000", "10.0.2.1:8000"


class _Up:
    available = True
    fail_open = True


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def pair_behind_credits(
    clock: FakeClock, store: MemoryLeaseStore, *, prefill_cap: int | None, decode_cap: int | None
) -> tuple[PairAdmission, Admission, SlotCredits]:
    """The pair admission of a pool with one prefill and one decode replica, each set capped as given,
    its credits on `store` (queue waits bounded by class only: the clock is stepped by hand)."""
    prefill: dict[str, object] = {"replicas": {"static": [PREFILL_URL]}}
    decode: dict[str, object] = {"replicas": {"static": [DECODE_URL]}}
    if prefill_cap is not None:
        prefill["max_concurrency_per_replica"] = prefill_cap
    if decode_cap is not None:
        decode["max_concurrency_per_replica"] = decode_cap
    pool = {
        "model": MODEL,
        "slo": {"queue_wait_ratio": None},
        "disaggregation": {"protocol": "vllm", "prefill": prefill, "decode": decode},
    }
    settings = parse_settings({"pools": [pool]})
    metrics = GatewayMetrics()
    registry = ReplicaRegistry(settings, metrics, clock, random.Random(0))
    credits = SlotCredits(store, _Up(), clock, ttl_s=3.0, linger_s=1.0, autostart=False)
    gate = TenantGate.in_memory(clock)
    admission = build_admission(
        settings,
        registry=registry,
        router=Router(metrics),
        gate=gate,
        clock=clock,
        metrics=metrics,
        credits=credits,
    )
    add_pair_admissions(
        admission, settings, registry=registry, gate=gate, clock=clock, metrics=metrics, credits=credits
    )
    return admission.pair(MODEL), admission, credits


def request() -> AdmissionRequest:
    return AdmissionRequest(Tenant("t"), "interactive", 0, RoutingRequest(model=MODEL))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=100.0)


@pytest.fixture
def store(clock: FakeClock) -> MemoryLeaseStore:
    return MemoryLeaseStore(clock, LeaseScope.REPLICA)


async def test_a_queued_pair_request_asks_for_credits_and_is_dispatched_when_they_come(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """Found by reading the pair admission: its queue was nobody's demand, so the refiller asked Redis
    for nothing and a pair request queued for a credit waited out its class's wait."""
    pair, admission, credits = pair_behind_credits(clock, store, prefill_cap=1, decode_cap=2)
    task: asyncio.Task[Ticket[Slot]] = asyncio.create_task(pair.admit(request()))
    await settle()
    assert not task.done() and pair.queue_depth() == 1, "no credit held yet: it queues"
    assert admission.queue_depth(MODEL) == 1
    await credits.step()
    await settle()
    assert task.done(), "the credits the pair's waiter asked for woke it"
    ticket = task.result()
    assert {role: slot.replica.replica_id for role, slot in ticket.slots.items()} == {
        SlotRole.PREFILL: PREFILL_RID,
        SlotRole.DECODE: DECODE_RID,
    }
    assert credits.held(f"{MODEL}/prefill", PREFILL_RID) == 1
    assert await store.count(slot_resource_id(f"{MODEL}/prefill", PREFILL_RID)) == 1
    assert credits.held(MODEL, DECODE_RID) >= 1
    await ticket.release()
    assert pair.queue_depth() == 0


async def test_one_capped_set_makes_a_first_arrival_queue_rather_than_be_refused_early(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """Credits govern a set only where it has a configured cap; either set's is enough for the pair's
    first-in-line arrivals to queue (a queued request is what asks Redis), as in an aggregated pool."""
    capped_prefill, _, _ = pair_behind_credits(clock, store, prefill_cap=1, decode_cap=None)
    assert capped_prefill.controller._config.early_refusal_needs_queue
    capped_decode, _, _ = pair_behind_credits(clock, store, prefill_cap=None, decode_cap=1)
    assert capped_decode.controller._config.early_refusal_needs_queue
    uncapped, _, _ = pair_behind_credits(clock, store, prefill_cap=None, decode_cap=None)
    assert not uncapped.controller._config.early_refusal_needs_queue


async def test_the_pair_queue_keeps_asking_while_one_set_holds_its_credits(
    clock: FakeClock, store: MemoryLeaseStore
) -> None:
    """A second pair request behind a prefill set of one slot waits for that slot, not for a credit it
    holds, and is dispatched at the first one's release; nothing is left held once both are done."""
    pair, _, credits = pair_behind_credits(clock, store, prefill_cap=1, decode_cap=2)
    first = asyncio.create_task(pair.admit(request()))
    second = asyncio.create_task(pair.admit(request()))
    await settle()
    await credits.step()
    await settle()
    assert first.done() and not second.done(), "the prefill set's one slot"
    await first.result().release()
    await settle()
    assert second.done(), "woken by the release"
    await second.result().release()
    for _ in range(3):  # idle past the linger: every credit goes back
        clock.advance(2.0)
        await credits.step()
    assert credits.held(f"{MODEL}/prefill", PREFILL_RID) == 0 and credits.held(MODEL, DECODE_RID) == 0
    assert await store.count(slot_resource_id(f"{MODEL}/prefill", PREFILL_RID)) == 0
