"""A waiter at its deadline, through a pool's admission: it may take a slot in the headroom a learned cap
leaves below the objective (cap × 1 / tpot_target_ratio), never above it, and never above a configured
cap; with `deadline_headroom: false` admission gets no such hook. A waiter held for its prefix's owner
waits for that try when the owner has room in the headroom, instead of spilling before its deadline."""

from __future__ import annotations

from typing import Any

from admission.holds import Hold, WaitContext
from admission.tenants import Tenant
from admission.ticket import AdmissionRequest
from gateway.config.settings import parse_settings
from gateway.proxy.admit import PoolAdmission
from gateway.upstream.replica import Replica
from router.keys import build_routing_request
from tests.unit.gateway.in_memory_admission import learn_a_cap_of_50, pool_admission

MODEL = "m"


def one_replica_pool(**pool: Any) -> tuple[PoolAdmission, Replica]:
    """A pool of one replica whose learned cap is 50 (TPOT objective 50 ms)."""
    admission, (replica,) = capped_pool(["http://10.0.0.1:8000"], **pool)
    return admission, replica


def capped_pool(urls: list[str], **pool: Any) -> tuple[PoolAdmission, list[Replica]]:
    """A pool of `urls` (prefix-index, the default) whose replicas all learned a cap of 50 (TPOT objective
    50 ms, TTFT objective 10 s)."""
    settings = parse_settings(
        {
            "pools": [
                {"model": MODEL, "replicas": {"static": urls}, "slo": {"tpot_s": 0.05, "ttft_s": 10}, **pool}
            ]
        }
    )
    admission, registry = pool_admission(settings, MODEL)
    replicas = list(registry.pools[MODEL].replicas.values())
    for replica in replicas:
        learn_a_cap_of_50(replica)
    return admission, replicas


def request() -> AdmissionRequest:
    return AdmissionRequest(Tenant("t"), "interactive", 100, build_routing_request(MODEL, "a prompt"))


def test_at_the_deadline_the_learned_cap_stretches_by_its_headroom_and_no_further() -> None:
    admission, replica = one_replica_pool()  # tpot_target_ratio 0.8: headroom ⌊50 / 0.8⌋ = 62
    replica.inflight_requests = 50
    assert admission.try_dispatch(request()) is None, "at the cap: an ordinary try waits"
    replica.inflight_requests = 61
    slot = admission.try_at_deadline(request())
    assert slot is not None and replica.inflight_requests == 62
    assert admission.try_at_deadline(request()) is None, "the headroom is full"
    slot.release()
    assert replica.inflight_requests == 61


def test_the_headroom_follows_the_set_point_ratio() -> None:
    admission, replica = one_replica_pool(latency_model={"tpot_target_ratio": 1.0})
    replica.inflight_requests = 50
    assert admission.try_at_deadline(request()) is None, "a set point at the objective leaves none"


def test_a_configured_cap_is_never_stretched() -> None:
    admission, replica = one_replica_pool(max_concurrency_per_replica=52)
    replica.inflight_requests = 52
    assert admission.try_at_deadline(request()) is None


def test_off_admission_gets_no_deadline_hook() -> None:
    on, _ = one_replica_pool()
    off, _ = one_replica_pool(latency_model={"deadline_headroom": False})
    assert on.controller._queue_pump._try_at_deadline is not None
    assert off.controller._queue_pump._try_at_deadline is None


def test_a_waiter_for_an_owner_with_room_in_the_headroom_waits_for_the_deadlines_try() -> None:
    """The owner is full by its learned cap, another replica is free: the expected slot at the owner
    (W = 1 × 200 s / 50 = 4 s) comes after the deadline (2 s), so the wait used to end at once and the
    request spilled its whole prefix to the free replica; with the owner under its headroom (⌊50 / 0.8⌋)
    the deadline's try will take the owner, so it waits, bounded by its TTFT objective (10 − 4 = 6 s)."""
    admission, replicas = capped_pool(["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    prompt = "a long shared system prompt " * 60
    routing = build_routing_request(MODEL, prompt, slo_ttft_s=10.0)
    first = admission.try_dispatch(AdmissionRequest(Tenant("t"), "interactive", 100, routing))
    assert first is not None
    owner = first.replica
    other = next(r for r in replicas if r is not owner)
    owner.inflight_requests, other.inflight_requests = 50, 0
    waiter = AdmissionRequest(Tenant("t"), "interactive", 100, routing)
    context = WaitContext(0.0, 0.0, 2.0, 200.0, {}, {})
    assert admission.prefer_wait(waiter, context) == Hold(owner.replica_id, 6.0)
    owner.inflight_requests = 62  # the headroom full too: the deadline's try would spill it anyway
    assert admission.prefer_wait(waiter, context) is None, "it spills now, as before"
    off, off_replicas = capped_pool(
        ["http://10.0.0.1:8000", "http://10.0.0.2:8000"], latency_model={"deadline_headroom": False}
    )
    slot = off.try_dispatch(AdmissionRequest(Tenant("t"), "interactive", 100, routing))
    assert slot is not None
    for replica in off_replicas:
        replica.inflight_requests = 50 if replica is slot.replica else 0
    assert off.prefer_wait(waiter, context) is None, "no try at the deadline: the wait ends before it"
