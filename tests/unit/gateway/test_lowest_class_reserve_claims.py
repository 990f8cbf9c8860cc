"""The lowest class's reserve, through a pool's admission: batch leaves the top of a learned cap to
the classes above once they have demand, and fills it all when they have none."""

from __future__ import annotations

from admission.tenants import Tenant
from admission.ticket import AdmissionRequest
from gateway.config.settings import parse_settings
from gateway.proxy.admit import PoolAdmission
from gateway.upstream.replica import Replica
from router.keys import build_routing_request
from tests.unit.gateway.in_memory_admission import learn_a_cap_of_50, pool_admission

MODEL = "m"
TENANT = Tenant("t")


def one_replica_pool(reserve: float = 0.1) -> tuple[PoolAdmission, Replica]:
    """A pool of one replica whose learned cap is 50 (TPOT objective 50 ms)."""
    settings = parse_settings(
        {
            "pools": [
                {"model": MODEL, "replicas": {"static": ["http://10.0.0.1:8000"]}, "slo": {"tpot_s": 0.05}}
            ],
            "admission": {"lowest_class_reserve": reserve},
        }
    )
    admission, registry = pool_admission(settings, MODEL)
    (replica,) = registry.pools[MODEL].replicas.values()
    learn_a_cap_of_50(replica)
    return admission, replica


def request(priority: str) -> AdmissionRequest:
    return AdmissionRequest(TENANT, priority, 100, build_routing_request(MODEL, f"a {priority} prompt"))


async def test_batch_fills_the_whole_cap_until_a_class_above_arrives_then_leaves_it_the_top() -> None:
    admission, replica = one_replica_pool()
    replica.inflight_requests = 45
    alone = admission.try_dispatch(request("batch"))
    assert alone is not None, "nothing above batch has arrived: the whole cap (45 of 50)"
    alone.release()
    ticket = await admission.admit(request("interactive"))  # demand above batch
    await ticket.release()
    assert replica.inflight_requests == 45
    assert admission.try_dispatch(request("batch")) is None, "90 % of 50 runs: batch waits"
    assert admission.slots_over_caps(request("batch")) == 0
    taken = admission.try_dispatch(request("interactive"))
    assert taken is not None, "the classes above fill the rest of the cap"
    taken.release()
    replica.inflight_requests = 48
    assert admission.slots_over_caps(request("batch")) == 3, "as batch sees the cap: 48 run over its 45"
    assert admission.slots_over_caps(request("interactive")) == 0


async def test_without_a_reserve_batch_shares_the_cap_first_come_first_served() -> None:
    admission, replica = one_replica_pool(reserve=0.0)
    ticket = await admission.admit(request("interactive"))
    await ticket.release()
    replica.inflight_requests = 45
    slot = admission.try_dispatch(request("batch"))
    assert slot is not None
    slot.release()
