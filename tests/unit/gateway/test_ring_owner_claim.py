"""A ring keeps its key's owner through a learned cap (`gateway.proxy.ring_owner_claim`): where routing
would move a request along the ring because its owner is at its learned cap, the owner takes it within
the headroom that cap leaves below the objective (cap × 1 / tpot_target_ratio); never over a
configured cap, never over the ring's bound, never instead of a wait."""

from __future__ import annotations

from typing import Any

from admission.tenants import Tenant
from admission.ticket import AdmissionRequest
from gateway.config.settings import parse_settings
from gateway.proxy.admit import PoolAdmission
from gateway.upstream.replica import Replica
from router.keys import build_routing_request
from tests.unit.gateway.in_memory_admission import pool_admission

MODEL = "m"
PROMPT = "You are a support agent for the ACME fleet. " * 40
SESSION = "conversation-17"


def ring_pool(policy: str = "prefix-affinity", **pool: Any) -> tuple[PoolAdmission, Replica, Replica]:
    """Two replicas under `policy` (a ring), both with a learned cap of 50: (admission, the key's
    owner, the other one)."""
    settings = parse_settings(
        {
            "pools": [
                {
                    "model": MODEL,
                    "policy": policy,
                    "replicas": {"static": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]},
                    "slo": {"tpot_s": 0.05},
                    **pool,
                }
            ]
        }
    )
    admission, registry = pool_admission(settings, MODEL)
    replicas = registry.pools[MODEL].replicas
    set_point_s = 0.05 * settings.pools[0].latency_model.tpot_target_ratio
    for replica in replicas.values():
        learn_a_windowed_cap_of_50(replica, set_point_s)
    probe = admission.try_dispatch(request(SESSION if policy == "session-affinity" else None))
    assert probe is not None
    owner = probe.replica
    probe.release()
    (other,) = (r for r in replicas.values() if r is not owner)
    return admission, owner, other


def learn_a_windowed_cap_of_50(replica: Replica, set_point_s: float) -> None:
    """Two engine windows: twice the set point at a batch of 62 — the first cut, 62 × 0.5^0.3 = 50.4 —,
    then 0.75 × the set point at a batch of 60, which moves nothing (the smoothed latency is still over
    the set point: 60 × gradient^0.3 > 50.4) but leaves the last window under it."""
    replica.cost.engine_sampled(2 * set_point_s, engine_batch=62, own_inflight=62)
    replica.cost.engine_sampled(0.75 * set_point_s, engine_batch=60, own_inflight=60)
    assert replica.cost.learned_cap == 50 and replica.cost.cap_has_room


def request(session: str | None = None) -> AdmissionRequest:
    routing = build_routing_request(MODEL, PROMPT + "Hi?", session_key=session)
    return AdmissionRequest(Tenant("t"), "interactive", 100, routing)


def test_an_owner_at_its_learned_cap_takes_the_request_within_the_headroom_instead_of_spilling() -> None:
    admission, owner, other = ring_pool()  # headroom ⌊50 / 0.8⌋ = 62
    owner.inflight_requests, other.inflight_requests = 50, 45  # bound ⌈1.25 × 96 / 2⌉ = 60
    slot = admission.try_dispatch(request())
    assert slot is not None and slot.replica is owner, "kept at its owner, not a cold prefill on the other"
    assert slot.decision.branch == "ring_hit"
    assert owner.inflight_requests == 51 and other.inflight_requests == 45
    slot.release()
    assert owner.inflight_requests == 50


def test_past_the_headroom_the_request_moves_along_the_ring() -> None:
    admission, owner, other = ring_pool()
    owner.inflight_requests, other.inflight_requests = 62, 45  # headroom full; bound ⌈1.25 × 108 / 2⌉ = 68
    slot = admission.try_dispatch(request())
    assert slot is not None and slot.replica is other
    slot.release()


def test_an_owner_over_the_rings_bound_is_not_stretched() -> None:
    admission, owner, other = ring_pool()
    owner.inflight_requests, other.inflight_requests = 50, 10  # bound ⌈1.25 × 61 / 2⌉ = 39
    slot = admission.try_dispatch(request())
    assert slot is not None and slot.replica is other, "the bound moves it on, cap or no cap"
    slot.release()


def test_with_no_free_slot_anywhere_the_request_waits_rather_than_stretch() -> None:
    admission, owner, other = ring_pool()
    owner.inflight_requests, other.inflight_requests = 50, 50
    assert admission.try_dispatch(request()) is None
    assert owner.inflight_requests == 50 and other.inflight_requests == 50


def test_a_configured_cap_is_never_stretched() -> None:
    admission, owner, other = ring_pool(max_concurrency_per_replica=50)
    owner.inflight_requests, other.inflight_requests = 50, 45
    slot = admission.try_dispatch(request())
    assert slot is not None and slot.replica is other
    slot.release()


def test_an_owner_whose_engine_runs_at_its_set_point_is_not_stretched() -> None:
    """A cap binding at the set point holds the objective: the request moves along the ring."""
    admission, owner, other = ring_pool()
    owner.cost.engine_sampled(0.045, engine_batch=60, own_inflight=60)  # over the 40 ms set point
    assert owner.cost.learned_cap == 50 and not owner.cost.cap_has_room
    owner.inflight_requests, other.inflight_requests = 50, 45
    slot = admission.try_dispatch(request())
    assert slot is not None and slot.replica is other
    slot.release()


def test_a_set_point_at_the_objective_leaves_no_headroom() -> None:
    admission, owner, other = ring_pool(latency_model={"tpot_target_ratio": 1.0})
    owner.inflight_requests, other.inflight_requests = 50, 45
    slot = admission.try_dispatch(request())
    assert slot is not None and slot.replica is other
    slot.release()


def test_a_session_ring_keeps_its_sessions_replica_the_same_way() -> None:
    admission, owner, other = ring_pool("session-affinity")
    owner.inflight_requests, other.inflight_requests = 50, 45
    slot = admission.try_dispatch(request(SESSION))
    assert slot is not None and slot.replica is owner
    assert slot.decision.branch == "session_hit"
    slot.release()
