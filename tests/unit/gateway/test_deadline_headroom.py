"""A waiter at its deadline, through a pool's admission: it may take a slot in the headroom a learned cap
leaves below the objective (cap × 1 / tpot_target_ratio), never above it, and never above a configured
cap; with `deadline_headroom: false` admission gets no such hook."""

from __future__ import annotations

from typing import Any

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
    settings = parse_settings(
        {
            "pools": [
                {
                    "model": MODEL,
                    "replicas": {"static": ["http://10.0.0.1:8000"]},
                    "slo": {"tpot_s": 0.05},
                    **pool,
                }
            ]
        }
    )
    admission, registry = pool_admission(settings, MODEL)
    (replica,) = registry.pools[MODEL].replicas.values()
    learn_a_cap_of_50(replica)
    return admission, replica


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
