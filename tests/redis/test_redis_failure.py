import logging
import time

import pytest
from redis.asyncio import Redis

from admission.leases import Lease, LeaseScope
from admission.outcomes import RejectReason
from admission.rate_limit import TenantRateLimits, TokenBucketLimit
from admission.redis_leases import RedisLeaseStore
from admission.redis_rate_limit import RedisRateLimitStore
from core.clock import FakeClock
from core.shared_state import RedisBackend
from core.state_outage import FailureMode, RedisOperation

from .conftest import CLOSED_PORT_URL, REDIS_URL, BackendFactory, TcpProxy

pytestmark = pytest.mark.redis

LIMITS = TenantRateLimits(requests=TokenBucketLimit(capacity=1, refill_per_s=0.001))


async def test_fail_open_allows_and_counts(make_backend: BackendFactory) -> None:
    seen: list[RedisOperation] = []
    backend = make_backend(CLOSED_PORT_URL, on_error=FailureMode.FAIL_OPEN, on_error_callback=seen.append)
    limiter = RedisRateLimitStore(backend)
    leases = RedisLeaseStore(backend, LeaseScope.REPLICA)
    started_s = time.monotonic()
    result = await limiter.acquire("t", LIMITS, 0)
    assert result.allowed and result.degraded
    lease = await leases.acquire("r1", cap=1, ttl_s=5.0)
    assert lease is not None and lease.degraded
    assert await leases.renew(lease) and await leases.release(lease)
    assert time.monotonic() - started_s < 1.0  # refused connections fail fast
    await limiter.reconcile("t", TenantRateLimits(tokens=TokenBucketLimit(10, 1)), 5)
    assert await leases.count("r1") == 0
    assert backend.errors_total == 4
    assert seen == [
        RedisOperation.RATE_LIMIT_ACQUIRE,
        RedisOperation.LEASE_ACQUIRE,
        RedisOperation.RATE_LIMIT_RECONCILE,
        RedisOperation.LEASE_COUNT,
    ]
    assert not backend.available


async def test_fail_closed_refuses_and_counts(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    backend = make_backend(CLOSED_PORT_URL, on_error=FailureMode.FAIL_CLOSED, clock=clock)
    limiter = RedisRateLimitStore(backend)
    leases = RedisLeaseStore(backend, LeaseScope.REPLICA)
    refused = await limiter.acquire("t", LIMITS, 0)
    assert not refused.allowed and refused.degraded and refused.reason is RejectReason.RATE_LIMITED
    assert refused.retry_after_s == 1.0
    clock.advance(7.5)
    assert (await limiter.acquire("t", LIMITS, 0)).retry_after_s == 7.5  # the outage's age so far
    assert await leases.acquire("r1", cap=1, ttl_s=5.0) is None
    assert not await leases.renew(Lease(LeaseScope.REPLICA, "r1", "x", 5.0))
    assert not await leases.release(Lease(LeaseScope.REPLICA, "r1", "x", 5.0))
    assert backend.errors_total == 5
    assert backend.on_error is FailureMode.FAIL_CLOSED


async def test_unanswered_calls_time_out_quickly(make_backend: BackendFactory, silent_server: str) -> None:
    backend = make_backend(silent_server, timeout_s=0.1, on_error=FailureMode.FAIL_CLOSED)
    started_s = time.monotonic()
    assert not (await RedisRateLimitStore(backend).acquire("t", LIMITS, 0)).allowed
    assert time.monotonic() - started_s < 0.5
    assert backend.errors_total == 1


async def test_errors_are_logged_once_per_interval(
    make_backend: BackendFactory, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    backend = make_backend(CLOSED_PORT_URL, clock=clock, log_interval_s=30.0)
    limiter = RedisRateLimitStore(backend)
    with caplog.at_level(logging.WARNING, logger="core.state_outage"):
        for _ in range(10):
            await limiter.acquire("t", LIMITS, 0)
        clock.advance(29.0)
        await limiter.acquire("t", LIMITS, 0)
        assert len(caplog.records) == 1
        clock.advance(1.0)
        await limiter.acquire("t", LIMITS, 0)
    assert len(caplog.records) == 2
    assert "11 error(s) since last report" in caplog.records[1].getMessage()
    assert backend.errors_total == 12


async def test_recovers_by_itself_when_redis_returns(
    make_backend: BackendFactory, redis_proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make_backend(redis_proxy.url, on_error=FailureMode.FAIL_CLOSED)
    leases = RedisLeaseStore(backend, LeaseScope.REPLICA)
    assert await leases.acquire("r1", cap=5, ttl_s=30.0) is not None  # connection pooled, script loaded
    await redis_proxy.stop()
    assert await leases.acquire("r1", cap=5, ttl_s=30.0) is None
    assert not backend.available and backend.errors_total == 1
    await redis_proxy.start()  # same port
    with caplog.at_level(logging.WARNING, logger="core.state_outage"):
        lease = await leases.acquire("r1", cap=5, ttl_s=30.0)
    assert lease is not None and not lease.degraded
    assert backend.available and backend.errors_total == 1
    assert await leases.count("r1") == 2
    assert any("reachable again" in record.getMessage() for record in caplog.records)


async def test_production_constructor_uses_server_time(key_prefix: str, raw_redis: Redis) -> None:
    backend = RedisBackend.from_url(REDIS_URL, key_prefix=key_prefix, on_error=FailureMode.FAIL_CLOSED)
    try:
        assert backend.now_arg() == ""
        leases = RedisLeaseStore(backend, LeaseScope.REPLICA)
        assert await leases.acquire("r1", cap=1, ttl_s=5.0) is not None
        assert await raw_redis.exists(f"{key_prefix}lease:replica:r1") == 1
    finally:
        await backend.aclose()
