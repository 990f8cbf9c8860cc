from typing import Any

import pytest

from admission.retry_budget import RetryBudget
from core.clock import FakeClock


def spend_all(budget: RetryBudget) -> int:
    spent = 0
    while budget.try_spend():
        spent += 1
    return spent


def test_floor_allows_a_few_retries_without_traffic() -> None:
    budget = RetryBudget(FakeClock(), budget_ratio=0.1, min_retries_per_s=0.5, window_s=10.0)
    assert budget.available() == 5
    assert spend_all(budget) == 5
    assert budget.refused_total == 1


def test_retries_are_a_fraction_of_requests() -> None:
    budget = RetryBudget(FakeClock(), budget_ratio=0.1, min_retries_per_s=0.0)
    budget.record_request(100)
    assert spend_all(budget) == 10
    budget.record_request(10)
    assert spend_all(budget) == 1


def test_window_slides_requests_and_retries_out() -> None:
    clock = FakeClock()
    budget = RetryBudget(clock, budget_ratio=0.2, min_retries_per_s=0.0, window_s=10.0, bucket_count=10)
    budget.record_request(50)  # bucket [0, 1)
    clock.set(5.0)
    budget.record_request(50)  # bucket [5, 6)
    assert spend_all(budget) == 20
    clock.set(9.9)
    assert budget.available() == 0
    clock.set(10.0)  # bucket [0, 1) slid out: 50 requests -> 10 allowed, 20 spent at t=5 still count
    assert budget.available() == 0
    clock.set(15.0)  # everything from t=5 slid out too
    assert budget.available() == 0
    budget.record_request(10)
    assert budget.available() == 2


def test_a_jump_longer_than_the_window_clears_it() -> None:
    clock = FakeClock()
    budget = RetryBudget(clock, budget_ratio=0.1, min_retries_per_s=0.1, window_s=10.0)
    budget.record_request(1000)
    assert spend_all(budget) == 101
    clock.advance(1000.0)
    assert budget.available() == 1


def test_retries_counted_where_they_happen() -> None:
    clock = FakeClock()
    budget = RetryBudget(clock, budget_ratio=0.5, min_retries_per_s=0.0, window_s=4.0, bucket_count=4)
    budget.record_request(10)
    clock.set(3.0)
    assert spend_all(budget) == 5
    clock.set(4.0)  # requests of t=0 left; the retries of t=3 remain
    budget.record_request(10)
    assert budget.available() == 0
    clock.set(7.0)
    assert budget.available() == 5


@pytest.mark.parametrize(
    "kwargs",
    [{"budget_ratio": -0.1}, {"min_retries_per_s": -1.0}, {"window_s": 0.0}, {"bucket_count": 0}],
)
def test_invalid_arguments_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryBudget(FakeClock(), **kwargs)
