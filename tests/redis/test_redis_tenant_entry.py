"""`admission.redis_tenant_entry`: a tenant's rate limits and bulkhead in one script decide as the two
calls do (the rate-limit script, then the lease acquire), on the same keys, atomically."""

import asyncio

import pytest
from redis.asyncio import Redis

from admission.leases import LeaseScope
from admission.outcomes import AdmissionRefused
from admission.rate_limit import LimitKind, TenantRateLimits, TokenBucketLimit
from admission.redis_leases import RedisLeaseStore
from admission.redis_rate_limit import RedisRateLimitStore
from admission.redis_tenant_entry import RedisTenantEntry
from admission.tenant_gate import TenantGate
from admission.tenants import Tenant
from core.clock import FakeClock
from core.shared_state import RedisBackend
from core.state_outage import FailureMode

from .conftest import BURST_TIMEOUT_S, CLOSED_PORT_URL, BackendFactory

pytestmark = pytest.mark.redis

LIMITS = TenantRateLimits(requests=TokenBucketLimit.per_minute(60), tokens=TokenBucketLimit.per_minute(6000))


def entry_on(backend: RedisBackend) -> tuple[RedisTenantEntry, RedisRateLimitStore, RedisLeaseStore]:
    rate_limits = RedisRateLimitStore(backend)
    leases = RedisLeaseStore(backend, LeaseScope.TENANT)
    return RedisTenantEntry(backend, rate_limits, leases), rate_limits, leases


async def test_same_decisions_and_levels_as_the_two_calls(
    make_backend: BackendFactory, key_prefix: str
) -> None:
    """Step by step against the two-call path on its own keys: allowed, leased, the buckets' levels."""
    clock = FakeClock(start_s=1000.0)
    entry, _, one_leases = entry_on(make_backend(script_time=clock, key_prefix=key_prefix + "a:"))
    two_rl = RedisRateLimitStore(make_backend(script_time=clock, key_prefix=key_prefix + "b:"))
    two_leases = RedisLeaseStore(
        make_backend(script_time=clock, key_prefix=key_prefix + "b:"), LeaseScope.TENANT
    )
    steps = [(1000, 0.0), (3000, 0.0), (2500, 0.0), (100, 2.0), (900, 0.5), (50_000, 3.0), (10, 60.0)]
    for estimated_tokens, advance_s in steps:
        clock.advance(advance_s)
        got, lease = await entry.enter("t", LIMITS, estimated_tokens, 2, 30.0)
        expected = await two_rl.acquire("t", LIMITS, estimated_tokens)
        expected_lease = await two_leases.acquire("t", 2, 30.0) if expected.allowed else None
        if expected.allowed and expected_lease is None:  # the gate refunds the tokens it charged
            charged = min(estimated_tokens, LIMITS.tokens.capacity)  # type: ignore[union-attr]
            await two_rl.reconcile("t", LIMITS, -round(charged))
        assert got.allowed == expected.allowed
        assert (lease is None) == (expected_lease is None)
        assert got.retry_after_s == pytest.approx(expected.retry_after_s, abs=1e-4)
        assert await one_leases.count("t") == await two_leases.count("t")
    clock.advance(1.0)
    left, lease = await entry.enter("t", LIMITS, 0, 1000, 30.0)
    right = await two_rl.acquire("t", LIMITS, 0)
    for kind in LimitKind:
        assert left.remaining(kind) == pytest.approx(right.remaining(kind), abs=1e-3)
    assert lease is not None and await one_leases.release(lease)


async def test_fifty_concurrent_entries_across_instances_hold_the_bulkhead_at_five(
    make_backend: BackendFactory,
) -> None:
    entries = [entry_on(make_backend(timeout_s=BURST_TIMEOUT_S))[0] for _ in range(3)]
    limits = TenantRateLimits(requests=TokenBucketLimit.per_minute(1000))
    results = await asyncio.gather(*(entries[i % 3].enter("t", limits, 0, 5, 30.0) for i in range(50)))
    assert all(result.allowed for result, _ in results)
    assert sum(lease is not None for _, lease in results) == 5


async def test_a_bulkhead_refusal_charges_the_request_not_the_tokens(make_backend: BackendFactory) -> None:
    entry, _, _ = entry_on(make_backend())
    _, lease = await entry.enter("t", LIMITS, 1000, 1, 30.0)
    assert lease is not None
    second, refused = await entry.enter("t", LIMITS, 1000, 1, 30.0)
    assert second.allowed and refused is None
    assert second.remaining(LimitKind.REQUESTS) == pytest.approx(58, abs=0.1)
    assert second.remaining(LimitKind.TOKENS) == pytest.approx(5000, abs=1)


async def test_a_rate_limit_refusal_takes_no_lease(make_backend: BackendFactory) -> None:
    entry, _, leases = entry_on(make_backend())
    limits = TenantRateLimits(requests=TokenBucketLimit(capacity=1, refill_per_s=0.001))
    assert (await entry.enter("t", limits, 0, 5, 30.0))[1] is not None
    result, lease = await entry.enter("t", limits, 0, 5, 30.0)
    assert not result.allowed and lease is None and result.limited_by is LimitKind.REQUESTS
    assert await leases.count("t") == 1


@pytest.mark.parametrize("mode", [FailureMode.FAIL_OPEN, FailureMode.FAIL_CLOSED])
async def test_unreachable_redis_answers_as_the_first_of_the_two_calls(
    mode: FailureMode, make_backend: BackendFactory
) -> None:
    entry, _, _ = entry_on(make_backend(CLOSED_PORT_URL, on_error=mode))
    result, lease = await entry.enter("t", LIMITS, 10, 5, 30.0)
    assert result.degraded
    if mode is FailureMode.FAIL_OPEN:
        assert result.allowed and lease is not None and lease.degraded
    else:
        assert not result.allowed and lease is None


async def test_the_gate_enters_in_one_call_and_refuses_as_before(
    make_backend: BackendFactory, raw_redis: Redis
) -> None:
    backend = make_backend()
    entry, rate_limits, leases = entry_on(backend)
    gate = TenantGate(rate_limits, leases, FakeClock(), entry=entry)
    tenant = Tenant("t", requests_per_min=60, tokens_per_min=6000, max_concurrent=1)
    before = int((await raw_redis.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))
    admitted = await gate.enter(tenant, 100)
    after = int((await raw_redis.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))
    assert admitted.lease is not None and admitted.charged_tokens == 100
    assert after - before <= 2  # one script (two if another test's call landed in between)
    with pytest.raises(AdmissionRefused) as refused:
        await gate.enter(tenant, 100)
    assert refused.value.limited_by == "concurrency"
    await gate.leave(admitted, 1.0)
    assert await leases.count("t") == 0
    await gate.flush()
