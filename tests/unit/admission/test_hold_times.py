"""Per-key mean hold times (admission/hold_times.py) and the release forecast that feeds them: a key
is readable only once it has `min_samples` holds, the mean is exact until 1/smoothing samples and
exponentially weighted after, and memory stays bounded however many keys come and go."""

from __future__ import annotations

import pytest

from admission.hold_times import HoldTimesByKey
from admission.release_forecast import ReleaseForecast
from core.clock import FakeClock


def test_a_key_without_enough_samples_is_absent() -> None:
    times = HoldTimesByKey(smoothing=0.05, min_samples=3)
    assert times.get("r0") is None and len(times) == 0 and list(times) == []
    times.record("r0", 2.0)
    times.record("r0", 4.0)
    assert times.get("r0") is None and "r0" not in times and times.samples("r0") == 2
    times.record("r0", 6.0)
    assert times["r0"] == pytest.approx(4.0) and list(times) == ["r0"] and len(times) == 1
    with pytest.raises(KeyError):
        times["r1"]


def test_the_mean_is_exact_at_first_then_exponentially_weighted() -> None:
    times = HoldTimesByKey(smoothing=0.25, min_samples=1)
    for hold_s in (1.0, 2.0, 3.0, 4.0):  # n ≤ 1/0.25: the plain mean
        times.record("r0", hold_s)
    assert times["r0"] == pytest.approx(2.5)
    times.record("r0", 12.5)  # n = 5: weight 0.25, not 1/5
    assert times["r0"] == pytest.approx(2.5 + 0.25 * 10.0)


def test_keys_are_independent() -> None:
    times = HoldTimesByKey(smoothing=0.05, min_samples=2)
    for _ in range(2):
        times.record("fast", 1.0)
        times.record("slow", 9.0)
    assert dict(times) == {"fast": pytest.approx(1.0), "slow": pytest.approx(9.0)}


def test_memory_is_bounded_and_the_least_recently_recorded_key_goes_first() -> None:
    """Replicas removed from the pool are never recorded again: they age out of the table."""
    times = HoldTimesByKey(smoothing=0.05, min_samples=1, max_keys=3)
    for key in ("gone", "a", "b"):
        times.record(key, 1.0)
    times.record("gone", 1.0)  # recorded again: now the most recent
    times.record("c", 1.0)  # a fourth key evicts the least recent, "a"
    assert sorted(times) == ["b", "c", "gone"] and times.samples("a") == 0
    for n in range(10):
        times.record(f"new{n}", 1.0)
    assert len(times) == 3 and times.get("gone") is None


@pytest.mark.parametrize(
    "kwargs", [{"smoothing": 0.0}, {"smoothing": 1.5}, {"min_samples": 0}, {"max_keys": 0}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    values = {"smoothing": 0.05, **kwargs}
    with pytest.raises(ValueError):
        HoldTimesByKey(**values)  # type: ignore[arg-type]


def test_the_forecast_times_each_hold_for_the_key_it_was_dispatched_with() -> None:
    clock = FakeClock()
    forecast = ReleaseForecast(clock, min_samples_per_key=2)
    assert forecast.mean_hold_s_by_key.get("r0") is None, "no samples yet"
    keys = [forecast.hold("r0"), forecast.hold("r1"), forecast.hold("r0"), forecast.hold()]
    clock.advance(2.0)
    forecast.release(keys[0])
    forecast.release(keys[1])
    clock.advance(2.0)
    forecast.release(keys[2])
    forecast.release(keys[3])  # no key: counts for the pool mean only
    forecast.release(keys[2])  # a double release is ignored
    assert forecast.mean_hold_s_by_key.get("r0") == pytest.approx(3.0)  # (2 + 4) / 2
    assert forecast.mean_hold_s_by_key.get("r1") is None, "one sample: below min_samples_per_key"
    assert forecast.mean_hold_s is not None and len(forecast) == 0


def test_a_discarded_hold_is_not_timed_for_its_key() -> None:
    clock = FakeClock()
    forecast = ReleaseForecast(clock, min_samples_per_key=1)
    key = forecast.hold("r0")
    clock.advance(5.0)
    forecast.discard(key)
    forecast.release(key)
    assert forecast.mean_hold_s_by_key.get("r0") is None and forecast.mean_hold_s is None
