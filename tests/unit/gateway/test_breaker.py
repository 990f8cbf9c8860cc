from __future__ import annotations

from gateway.upstream.breaker import BreakerPolicy, BreakerState, CircuitBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _breaker(**kw: float) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(BreakerPolicy(**kw), clock), clock  # type: ignore[arg-type]


def test_opens_after_consecutive_failures_and_sends_nothing() -> None:
    breaker, _ = _breaker(consecutive_failures=3)
    for _ in range(2):
        breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED and breaker.allows()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allows()


def test_success_resets_the_consecutive_count() -> None:
    breaker, _ = _breaker(consecutive_failures=3, min_requests=1000)
    for _ in range(10):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert breaker.state is BreakerState.CLOSED


def test_opens_on_failure_ratio_over_the_window() -> None:
    breaker, clock = _breaker(consecutive_failures=100, failure_ratio=0.5, min_requests=10, window_s=10)
    for i in range(10):
        clock.now_s += 0.1
        breaker.record_failure() if i % 2 else breaker.record_success()
    assert breaker.state is BreakerState.OPEN


def test_old_outcomes_leave_the_window() -> None:
    breaker, clock = _breaker(consecutive_failures=100, failure_ratio=0.5, min_requests=4, window_s=1)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    clock.now_s += 5
    breaker.record_success()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED


def test_half_open_lets_one_probe_through_then_closes_on_success() -> None:
    breaker, clock = _breaker(consecutive_failures=1, open_s=5)
    breaker.record_failure()
    assert breaker.seconds_until_probe() == 5
    clock.now_s += 5
    assert breaker.state is BreakerState.HALF_OPEN and breaker.allows()
    breaker.on_dispatch()
    assert not breaker.allows(), "only one probe while half-open"
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allows()


def test_failed_probe_reopens_with_a_doubled_cooldown_capped() -> None:
    breaker, clock = _breaker(consecutive_failures=1, open_s=5, max_open_s=12)
    breaker.record_failure()
    for expected in (10, 12, 12):
        clock.now_s += 100
        breaker.on_dispatch()
        breaker.record_failure()
        assert breaker.state is BreakerState.OPEN
        assert breaker.seconds_until_probe() == expected
