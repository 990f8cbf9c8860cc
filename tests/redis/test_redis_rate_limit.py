import asyncio

import pytest
from redis.asyncio import Redis

from admission.rate_limit import LimitKind, MemoryRateLimitStore, TenantRateLimits, TokenBucketLimit
from admission.redis_rate_limit import RedisRateLimitStore
from admission.retry_after import rate_limit_retry_after_s
from core.clock import FakeClock
from core.state_outage import FailureMode, RedisOperation

from .conftest import BURST_TIMEOUT_S, CLOSED_PORT_URL, BackendFactory

pytestmark = pytest.mark.redis

LIMITS = TenantRateLimits(requests=TokenBucketLimit.per_minute(60), tokens=TokenBucketLimit.per_minute(6000))


async def test_same_decisions_as_the_memory_store(make_backend: BackendFactory) -> None:
    clock = FakeClock(start_s=1000.0)
    memory = MemoryRateLimitStore(clock)
    shared = RedisRateLimitStore(make_backend(script_time=clock))
    steps = [(1000, 0.0), (3000, 0.0), (2500, 0.0), (100, 2.0), (900, 0.5), (50_000, 3.0), (10, 60.0)]
    for estimated_tokens, advance_s in steps:
        clock.advance(advance_s)
        expected = await memory.acquire("t", LIMITS, estimated_tokens)
        got = await shared.acquire("t", LIMITS, estimated_tokens)
        assert got.allowed == expected.allowed
        assert got.retry_after_s == pytest.approx(expected.retry_after_s, abs=1e-4)
        assert got.reset_s == pytest.approx(expected.reset_s, abs=1e-4)
        for kind in LimitKind:
            assert got.remaining(kind) == pytest.approx(expected.remaining(kind), abs=1e-4)
        if got.allowed:
            await memory.reconcile("t", LIMITS, 500)
            await shared.reconcile("t", LIMITS, 500)


async def test_refusal_carries_the_refill_time_with_server_time(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    store = RedisRateLimitStore(make_backend())
    limits = TenantRateLimits(requests=TokenBucketLimit.per_minute(3))
    assert [(await store.acquire("t", limits, 0)).allowed for _ in range(4)] == [True, True, True, False]
    refused = await store.acquire("t", limits, 0)
    assert refused.limited_by is LimitKind.REQUESTS
    assert 19.0 < refused.retry_after_s <= 20.0  # one request refills in 20 s
    assert rate_limit_retry_after_s(refused.retry_after_s) == 20
    key = f"{key_prefix}rl:{{t}}:requests"
    ttl_ms = await raw_redis.pttl(key)
    assert 60_000 < ttl_ms <= 61_000  # the key expires once the bucket would be full again


async def test_concurrent_acquires_across_instances_never_exceed_the_burst(
    make_backend: BackendFactory,
) -> None:
    # Atomicity, not the timeout: 50 acquires at once open ~17 connections per backend, which a loaded
    # CI host can take longer than the production 0.25 s to do (the answer would then be fail-open).
    stores = [RedisRateLimitStore(make_backend(timeout_s=BURST_TIMEOUT_S)) for _ in range(3)]
    limits = TenantRateLimits(requests=TokenBucketLimit(capacity=10, refill_per_s=0.001))
    results = await asyncio.gather(*(stores[n % 3].acquire("t", limits, 0) for n in range(50)))
    assert not [result for result in results if result.degraded], "Redis did not answer within the timeout"
    assert sum(result.allowed for result in results) == 10


async def test_reconcile_is_shared_between_instances(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    first = RedisRateLimitStore(make_backend(script_time=clock))
    second = RedisRateLimitStore(make_backend(script_time=clock))
    limits = TenantRateLimits(tokens=TokenBucketLimit.per_minute(6000))
    assert (await first.acquire("t", limits, 1000)).allowed
    await first.reconcile("t", limits, 7000)
    refused = await second.acquire("t", limits, 1000)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(30.0)
    await second.reconcile("t", limits, -9000)
    assert (await first.acquire("t", limits, 6000)).allowed


async def test_unlimited_tenant_does_not_touch_redis(make_backend: BackendFactory) -> None:
    # A backend on a closed port with fail_closed: any call that reached for Redis would be refused,
    # counted in errors_total and reported to the callback.
    touched: list[RedisOperation] = []
    backend = make_backend(
        CLOSED_PORT_URL, on_error=FailureMode.FAIL_CLOSED, on_error_callback=touched.append
    )
    store = RedisRateLimitStore(backend)
    unlimited = await store.acquire("t", TenantRateLimits(), 100)
    assert unlimited.allowed and not unlimited.degraded
    await store.reconcile("t", TenantRateLimits(), 100)
    tokens_limited = TenantRateLimits(tokens=TokenBucketLimit.per_minute(6000))
    await store.reconcile("t", tokens_limited, 0)  # nothing to adjust: no call either
    requests_only = TenantRateLimits(requests=TokenBucketLimit.per_minute(60))
    await store.reconcile("t", requests_only, 100)  # no token bucket to adjust
    assert touched == [] and backend.errors_total == 0, "no Redis call was attempted"

    limited = await store.acquire("t", requests_only, 100)  # the probe works: a limited tenant calls
    assert not limited.allowed and limited.degraded
    assert touched == [RedisOperation.RATE_LIMIT_ACQUIRE] and backend.errors_total == 1
