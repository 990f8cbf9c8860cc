from __future__ import annotations

import pytest

from gateway.upstream.breaker import (
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    FailureEffect,
    ejection_budget,
)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _state(breaker: CircuitBreaker) -> BreakerState:
    """The state, read through a call (so that mypy does not narrow it between two reads)."""
    return breaker.state


def _breaker(**kw: float) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(BreakerPolicy(**kw), clock), clock  # type: ignore[arg-type]


def test_opens_after_consecutive_failures_and_sends_nothing() -> None:
    breaker, _ = _breaker(consecutive_failures=3)
    for _ in range(2):
        breaker.record_failure()
    assert _state(breaker) is BreakerState.CLOSED and breaker.allows()
    breaker.record_failure()
    assert _state(breaker) is BreakerState.OPEN and not breaker.allows()


def test_success_resets_the_consecutive_count() -> None:
    breaker, _ = _breaker(consecutive_failures=3, min_requests=1000)
    for _ in range(10):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()
    assert _state(breaker) is BreakerState.CLOSED


def test_opens_on_failure_ratio_over_the_window() -> None:
    breaker, clock = _breaker(consecutive_failures=100, failure_ratio=0.5, min_requests=10, window_s=10)
    for i in range(10):
        clock.now_s += 0.1
        breaker.record_failure() if i % 2 else breaker.record_success()
    assert _state(breaker) is BreakerState.OPEN


def test_old_outcomes_leave_the_window() -> None:
    breaker, clock = _breaker(consecutive_failures=100, failure_ratio=0.5, min_requests=4, window_s=1)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    clock.now_s += 5
    breaker.record_success()
    breaker.record_success()
    breaker.record_failure()
    assert _state(breaker) is BreakerState.CLOSED


def test_half_open_lets_one_probe_through_then_closes_on_success() -> None:
    breaker, clock = _breaker(consecutive_failures=1, open_s=5)
    breaker.record_failure()
    assert breaker.seconds_until_probe() == 5
    clock.now_s += 5
    assert _state(breaker) is BreakerState.HALF_OPEN and breaker.allows()
    breaker.on_dispatch()
    assert not breaker.allows(), "only one probe while half-open"
    breaker.record_success()
    assert _state(breaker) is BreakerState.CLOSED and breaker.allows()


def test_failed_probe_reopens_with_a_doubled_cooldown_capped() -> None:
    breaker, clock = _breaker(consecutive_failures=1, open_s=5, max_open_s=12)
    breaker.record_failure()
    for expected in (10, 12, 12):
        clock.now_s += 100
        breaker.on_dispatch()
        breaker.record_failure()
        assert _state(breaker) is BreakerState.OPEN
        assert breaker.seconds_until_probe() == expected


# --- the pool's ejection budget, as the breaker sees it: an injected `may_open()` -----------------------


def test_record_failure_says_what_it_did() -> None:
    breaker, clock = _breaker(consecutive_failures=2, open_s=5)
    assert breaker.record_failure() is FailureEffect.COUNTED
    assert breaker.record_failure() is FailureEffect.OPENED and breaker.ejected
    assert breaker.record_failure() is FailureEffect.COUNTED, "already open: counted only"
    clock.now_s += 5
    assert _state(breaker) is BreakerState.HALF_OPEN and breaker.ejected, "half-open is still ejected"
    breaker.on_dispatch()
    assert breaker.record_failure() is FailureEffect.REOPENED


def test_a_refused_trip_stays_closed_keeps_counting_and_opens_at_the_next_failure_with_room() -> None:
    budget_has_room = False
    clock = FakeClock()
    breaker = CircuitBreaker(BreakerPolicy(consecutive_failures=3), clock, may_open=lambda: budget_has_room)
    effects = [breaker.record_failure() for _ in range(5)]
    assert effects == [FailureEffect.COUNTED] * 2 + [FailureEffect.TRIP_REFUSED] * 3
    assert _state(breaker) is BreakerState.CLOSED and breaker.allows() and not breaker.ejected
    budget_has_room = True
    assert breaker.record_failure() is FailureEffect.OPENED, "the streak was kept: one more failure opens it"


def test_a_success_still_ends_a_refused_streak() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(
        BreakerPolicy(consecutive_failures=2, min_requests=1000), clock, may_open=lambda: False
    )
    assert [breaker.record_failure() for _ in range(3)][-1] is FailureEffect.TRIP_REFUSED
    breaker.record_success()
    assert breaker.record_failure() is FailureEffect.COUNTED


def test_a_failed_probe_reopens_without_asking_the_budget() -> None:
    asked: list[bool] = []
    clock = FakeClock()

    def may_open() -> bool:
        asked.append(True)
        return not asked[1:]  # yes once, then no

    breaker = CircuitBreaker(BreakerPolicy(consecutive_failures=1, open_s=5), clock, may_open=may_open)
    assert breaker.record_failure() is FailureEffect.OPENED
    clock.now_s += 5
    breaker.on_dispatch()
    assert breaker.record_failure() is FailureEffect.REOPENED
    assert len(asked) == 1, "a half-open breaker is already ejected: its probe failing asks nothing"


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [
        # n:              1  2  3  4  10
        (0.0, (0, 1, 1, 1, 1)),  # at least one when n ≥ 2 (Envoy's rule), none for a lone replica
        (0.5, (0, 1, 1, 2, 5)),
        (1.0, (1, 2, 3, 4, 10)),
    ],
)
def test_ejection_budget_is_floor_of_ratio_times_n_and_at_least_one_from_two(
    ratio: float, expected: tuple[int, ...]
) -> None:
    assert tuple(ejection_budget(n, ratio) for n in (1, 2, 3, 4, 10)) == expected
    assert ejection_budget(0, ratio) == 0


def test_ejection_budget_survives_floating_point() -> None:
    assert ejection_budget(100, 0.29) == 29, "0.29 × 100 is 28.999… in binary"
    assert ejection_budget(10, 0.3) == 3
