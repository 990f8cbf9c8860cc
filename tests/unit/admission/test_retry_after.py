import math

import pytest

from admission.dispatch_rate import DispatchRateMeter
from admission.priority_queue import PriorityQueue
from admission.retry_after import (
    DEFAULT_MAX_RETRY_AFTER_S,
    clamp_retry_after_s,
    concurrency_retry_after_s,
    draining_retry_after_s,
    no_replica_retry_after_s,
    queue_retry_after_s,
    rate_limit_retry_after_s,
)
from core.clock import FakeClock


@pytest.mark.parametrize(
    ("estimate_s", "expected"),
    [(0.0, 1), (-3.0, 1), (0.2, 1), (1.0, 1), (1.01, 2), (119.5, 120), (500.0, 120)],
)
def test_clamp_is_integer_ceil_between_one_and_max(estimate_s: float, expected: int) -> None:
    assert clamp_retry_after_s(estimate_s) == expected


@pytest.mark.parametrize("estimate_s", [math.inf, math.nan])
def test_clamp_maps_unknown_to_max(estimate_s: float) -> None:
    assert clamp_retry_after_s(estimate_s, max_s=30) == 30


def test_clamp_rejects_a_max_below_one() -> None:
    with pytest.raises(ValueError):
        clamp_retry_after_s(1.0, max_s=0)


def test_queue_uses_littles_law() -> None:
    assert queue_retry_after_s(ahead=50, dispatch_rate_per_s=10.0) == 5
    assert queue_retry_after_s(ahead=51, dispatch_rate_per_s=10.0) == 6
    assert queue_retry_after_s(ahead=0, dispatch_rate_per_s=10.0) == 1


def test_queue_estimate_is_capped_by_the_drain_bound() -> None:
    assert queue_retry_after_s(ahead=500, dispatch_rate_per_s=1.0, drain_bound_s=12.5) == 13


@pytest.mark.parametrize("rate", [None, 0.0])
def test_queue_fallback_without_a_measured_rate(rate: float | None) -> None:
    assert queue_retry_after_s(ahead=40, dispatch_rate_per_s=rate, drain_bound_s=7.5) == 8
    assert queue_retry_after_s(ahead=40, dispatch_rate_per_s=rate) == DEFAULT_MAX_RETRY_AFTER_S


def test_rate_limit_bulkhead_no_replica_and_draining() -> None:
    assert rate_limit_retry_after_s(12.3) == 13
    assert concurrency_retry_after_s(in_use=4, mean_service_s=10.0) == 3
    assert concurrency_retry_after_s(in_use=0, mean_service_s=0.4) == 1
    assert no_replica_retry_after_s([5.2, None, 2.1]) == 3
    assert no_replica_retry_after_s([None]) == DEFAULT_MAX_RETRY_AFTER_S
    assert no_replica_retry_after_s([], max_s=60) == 60
    assert draining_retry_after_s(4.5) == 5


def test_queue_full_retry_after_from_live_structures() -> None:
    clock = FakeClock()
    meter = DispatchRateMeter(clock)
    queue: PriorityQueue[int] = PriorityQueue(clock, max_depth=40)
    for n in range(40):
        queue.push(n, "critical")
    for _ in range(100):  # dispatches at 4/s for 25 s, refilling the queue each time
        clock.advance(0.25)
        assert queue.pop_next() is not None
        meter.record()
        queue.push(0, "critical")
    assert queue.push(-1, "critical").entry is None
    rate = meter.rate_per_s()
    assert rate == pytest.approx(4.0, rel=0.02)  # read just after a dispatch: slightly high
    retry_after = queue_retry_after_s(queue.ahead_of("critical"), rate, queue.drain_bound_s("critical"))
    assert retry_after == 10  # 40 ahead at 4/s
