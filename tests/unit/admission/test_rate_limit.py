import pytest

from admission.outcomes import RejectReason
from admission.rate_limit import (
    BucketState,
    LimitKind,
    MemoryRateLimitStore,
    RateLimitResult,
    TenantRateLimits,
    TokenBucketLimit,
    adjust_level,
    bucket_level,
)
from admission.retry_after import rate_limit_retry_after_s
from core.clock import FakeClock

RPM_60 = TenantRateLimits(requests=TokenBucketLimit.per_minute(60))
TPM_6000 = TenantRateLimits(tokens=TokenBucketLimit.per_minute(6000))


def test_per_minute_limit_is_a_bucket() -> None:
    limit = TokenBucketLimit.per_minute(600)
    assert (limit.capacity, limit.refill_per_s) == (600, 10.0)
    assert TokenBucketLimit.per_minute(600, burst=50).capacity == 50


@pytest.mark.parametrize(("capacity", "refill_per_s"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_invalid_limits_raise(capacity: float, refill_per_s: float) -> None:
    with pytest.raises(ValueError):
        TokenBucketLimit(capacity, refill_per_s)


async def test_unlimited_tenant_is_allowed_without_buckets() -> None:
    store = MemoryRateLimitStore(FakeClock())
    result = await store.acquire("t", TenantRateLimits(), estimated_tokens=10**6)
    assert result.allowed and result.buckets == () and result.reason is None
    await store.reconcile("t", TenantRateLimits(), delta_tokens=100)


async def test_request_bucket_exhausts_refills_and_reports_retry_after() -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(clock)
    first = await store.acquire("t", RPM_60, 0)
    assert first.allowed and first.remaining(LimitKind.REQUESTS) == 59
    assert first.reset_s == pytest.approx(1.0)
    assert first.remaining(LimitKind.TOKENS) is None
    for _ in range(59):
        assert (await store.acquire("t", RPM_60, 0)).allowed
    refused = await store.acquire("t", RPM_60, 0)
    assert not refused.allowed
    assert refused.reason is RejectReason.RATE_LIMITED
    assert refused.limited_by is LimitKind.REQUESTS
    assert refused.retry_after_s == pytest.approx(1.0)
    assert refused.reset_s == pytest.approx(60.0)
    assert rate_limit_retry_after_s(refused.retry_after_s) == 1
    clock.advance(0.5)
    assert (await store.acquire("t", RPM_60, 0)).retry_after_s == pytest.approx(0.5)
    clock.advance(0.5)
    assert (await store.acquire("t", RPM_60, 0)).allowed


async def test_token_bucket_retry_after_is_the_refill_time_for_the_cost() -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(clock)
    for _ in range(6):
        assert (await store.acquire("t", TPM_6000, 1000)).allowed
    refused = await store.acquire("t", TPM_6000, 1000)
    assert refused.retry_after_s == pytest.approx(10.0)  # 1000 tokens at 100/s
    assert rate_limit_retry_after_s(refused.retry_after_s) == 10
    clock.advance(4.0)
    refused = await store.acquire("t", TPM_6000, 1000)
    assert refused.retry_after_s == pytest.approx(6.0)
    assert refused.remaining(LimitKind.TOKENS) == pytest.approx(400.0)
    clock.advance(6.0)
    allowed = await store.acquire("t", TPM_6000, 1000)
    assert allowed.allowed and allowed.remaining(LimitKind.TOKENS) == pytest.approx(0.0, abs=1e-6)


async def test_buckets_are_all_or_nothing() -> None:
    limits = TenantRateLimits(
        requests=TokenBucketLimit.per_minute(60), tokens=TokenBucketLimit.per_minute(6000)
    )
    store = MemoryRateLimitStore(FakeClock())
    assert (await store.acquire("t", limits, 6000)).allowed
    refused = await store.acquire("t", limits, 500)
    assert not refused.allowed and refused.limited_by is LimitKind.TOKENS
    assert refused.remaining(LimitKind.REQUESTS) == 59  # the refused request spent nothing
    assert refused.retry_after_s == pytest.approx(5.0)


async def test_request_larger_than_the_burst_waits_for_a_full_bucket() -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(clock)
    assert (await store.acquire("t", TPM_6000, 100)).allowed
    refused = await store.acquire("t", TPM_6000, 50_000)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(1.0)
    clock.advance(1.0)
    allowed = await store.acquire("t", TPM_6000, 50_000)
    assert allowed.allowed and allowed.remaining(LimitKind.TOKENS) == pytest.approx(0.0, abs=1e-6)


async def test_reconcile_charges_underestimates_into_debt_and_refunds_overestimates() -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(clock)
    assert (await store.acquire("t", TPM_6000, 1000)).allowed  # level 5000
    await store.reconcile("t", TPM_6000, delta_tokens=7000)  # actual was 8000: level -2000
    refused = await store.acquire("t", TPM_6000, 1000)
    assert refused.retry_after_s == pytest.approx(30.0)  # 3000 tokens at 100/s
    await store.reconcile("t", TPM_6000, delta_tokens=100_000)  # debt floored at -capacity
    assert (await store.acquire("t", TPM_6000, 1000)).retry_after_s == pytest.approx(70.0)
    await store.reconcile("t", TPM_6000, delta_tokens=-100_000)  # refund capped at capacity
    assert (await store.acquire("t", TPM_6000, 1000)).remaining(LimitKind.TOKENS) == pytest.approx(5000.0)
    await store.reconcile("t", TPM_6000, delta_tokens=0)
    await store.reconcile("t", RPM_60, delta_tokens=500)  # no token limit: no-op


async def test_tenants_are_isolated() -> None:
    store = MemoryRateLimitStore(FakeClock())
    limits = TenantRateLimits(requests=TokenBucketLimit(capacity=1, refill_per_s=0.01))
    assert (await store.acquire("a", limits, 0)).allowed
    assert not (await store.acquire("a", limits, 0)).allowed
    assert (await store.acquire("b", limits, 0)).allowed


def test_pure_bucket_functions() -> None:
    limit = TokenBucketLimit(capacity=10, refill_per_s=2)
    assert bucket_level(None, limit, 5.0) == 10
    assert bucket_level(BucketState(level=1, updated_s=0.0), limit, 2.0) == 5
    assert bucket_level(BucketState(level=1, updated_s=0.0), limit, 100.0) == 10
    assert bucket_level(BucketState(level=1, updated_s=5.0), limit, 4.0) == 1  # no negative elapsed
    assert adjust_level(None, limit, 25, 0.0) == BucketState(level=-10, updated_s=0.0)


def test_result_without_buckets() -> None:
    result = RateLimitResult.from_readings(False, [])
    assert result.retry_after_s == 0.0 and result.limited_by is None
