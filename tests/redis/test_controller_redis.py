"""The admission controller on the Redis stores: tenant limits shared by two gateway instances."""

import asyncio

import pytest
from redis.asyncio import Redis

from admission.controller import AdmissionController
from admission.leases import LeaseScope
from admission.outcomes import AdmissionRefused, RejectReason
from admission.rate_limit import LimitKind
from admission.redis_leases import RedisLeaseStore
from admission.redis_rate_limit import RedisRateLimitStore
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from admission.timers import ManualTimers
from core.clock import FakeClock
from core.shared_state import RedisBackend
from core.state_outage import FailureMode
from tests.unit.admission_controller.fakes import FakeFleet, Slot, req, settle

from .conftest import CLOSED_PORT_URL, BackendFactory

pytestmark = pytest.mark.redis


class Instance:
    """One simulated gateway instance: its own Redis connection, gate, controller and fleet view."""

    def __init__(self, backend: RedisBackend, clock: FakeClock, slots: int = 10) -> None:
        self.timers = ManualTimers(clock)
        self.gate = TenantGate(
            RedisRateLimitStore(backend),
            RedisLeaseStore(backend, LeaseScope.TENANT),
            clock,
            timers=self.timers,
        )
        self.fleet = FakeFleet(slots)
        self.controller: AdmissionController[Slot] = AdmissionController(
            self.fleet.try_dispatch, self.gate, clock=clock, timers=self.timers
        )
        self.fleet.controller = self.controller


def two_instances(make_backend: BackendFactory, clock: FakeClock) -> tuple[Instance, Instance]:
    return (
        Instance(make_backend(script_time=clock), clock),
        Instance(make_backend(script_time=clock), clock),
    )


async def test_rate_limit_is_shared_across_instances_with_retry_after_from_the_bucket(
    make_backend: BackendFactory,
) -> None:
    clock = FakeClock(start_s=1000.0)
    one, two = two_instances(make_backend, clock)
    tenant = Tenant("acme", requests_per_min=3)
    grants = [await (one, two)[n % 2].controller.admit(req(f"r{n}", tenant=tenant)) for n in range(3)]
    for instance in (one, two):
        with pytest.raises(AdmissionRefused) as refused:
            await instance.controller.admit(req("over", tenant=tenant))
        assert refused.value.reason is RejectReason.RATE_LIMITED
        assert refused.value.limited_by == LimitKind.REQUESTS
        assert refused.value.retry_after_s == 20  # one request refills in 60 s / 3
    clock.advance(20.0)
    grants.append(await two.controller.admit(req("refilled", tenant=tenant)))
    for grant in grants:
        await grant.release()


async def test_bulkhead_is_shared_across_instances_and_every_lease_returns(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=1000.0)
    one, two = two_instances(make_backend, clock)
    tenant = Tenant("acme", max_concurrent=2, tokens_per_min=1000)
    first = await one.controller.admit(req("a", tokens=600, tenant=tenant))
    second = await two.controller.admit(req("b", tokens=100, tenant=tenant))
    with pytest.raises(AdmissionRefused) as refused:
        await one.controller.admit(req("c", tokens=300, tenant=tenant))
    assert refused.value.reason is RejectReason.RATE_LIMITED and refused.value.limited_by == "concurrency"
    assert refused.value.retry_after_s == 3  # 5 s mean service prior / 2 in use
    await one.gate.flush()  # the refused request's 300 tokens are refunded in Redis
    await first.reconcile(actual_tokens=500)  # 100 tokens back
    await first.release()
    third = await two.controller.admit(req("c", tokens=400, tenant=tenant))
    assert third.rate_limit is not None and third.rate_limit.remaining(LimitKind.TOKENS) == pytest.approx(0.0)
    await second.release()
    await third.release()
    await second.release()  # idempotent
    assert await one.gate.tenant_leases.count("acme") == 0
    assert await raw_redis.exists(f"{key_prefix}lease:tenant:acme") == 0


async def test_bulkhead_lease_renewal_keeps_a_long_request_counted(make_backend: BackendFactory) -> None:
    clock = FakeClock(start_s=1000.0)
    one, two = two_instances(make_backend, clock)
    tenant = Tenant("acme", max_concurrent=1)
    grant = await one.controller.admit(req("long", tenant=tenant))
    for _ in range(9):  # 90 s = 3 ttl of 30 s, renewed every 10 s
        one.timers.advance(10.0)
        await settle()
        await one.gate.flush()
    with pytest.raises(AdmissionRefused):
        await two.controller.admit(req("other-instance", tenant=tenant))
    await grant.release()
    assert one.timers.pending == 0 and one.gate.leases_lost_total == 0
    second = await two.controller.admit(req("after", tenant=tenant))
    await second.release()


@pytest.mark.parametrize("on_error", [FailureMode.FAIL_OPEN, FailureMode.FAIL_CLOSED])
async def test_unreachable_redis_follows_the_failure_mode(
    make_backend: BackendFactory, on_error: FailureMode
) -> None:
    clock = FakeClock()
    instance = Instance(make_backend(CLOSED_PORT_URL, on_error=on_error), clock)
    tenant = Tenant("acme", requests_per_min=10, max_concurrent=1)
    if on_error is FailureMode.FAIL_CLOSED:
        with pytest.raises(AdmissionRefused) as refused:
            await instance.controller.admit(req("a", tenant=tenant))
        # the limits cannot be checked, not exceeded: 503 state_unavailable, as the error contract says
        assert refused.value.reason is RejectReason.STATE_UNAVAILABLE and refused.value.retry_after_s >= 1
        assert refused.value.limited_by is None
        return
    grants = [await instance.controller.admit(req(f"a{n}", tenant=tenant)) for n in range(3)]
    for grant in grants:
        await grant.release()
    await asyncio.wait_for(instance.gate.flush(), timeout=2.0)
    assert instance.fleet.in_use == 0
