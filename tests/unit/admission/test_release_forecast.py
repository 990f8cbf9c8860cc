"""ReleaseForecast: when the grants held now are expected to free their slots."""

import pytest

from admission.release_forecast import ReleaseForecast
from core.clock import FakeClock


def _forecast_with_mean_hold(clock: FakeClock, hold_s: float) -> ReleaseForecast:
    forecast = ReleaseForecast(clock, smoothing=1.0)
    key = forecast.hold()
    clock.advance(hold_s)
    forecast.release(key)
    assert forecast.mean_hold_s == pytest.approx(hold_s)
    return forecast


def test_no_forecast_before_a_completion_or_beyond_one_hold_time() -> None:
    clock = FakeClock()
    forecast = ReleaseForecast(clock)
    forecast.hold()
    assert forecast.releases_due(1, 1.0) is None, "S unknown: nothing to say"
    forecast = _forecast_with_mean_hold(clock, 4.0)
    forecast.hold()
    assert forecast.releases_due(1, 4.0) is None, "within ≥ S: later dispatches would release too"
    assert forecast.releases_due(0, 1.0) is True


def test_a_cohort_dispatched_together_frees_nothing_until_one_hold_time_later() -> None:
    """The case the average rate gets wrong: 8 grants dispatched at once with S = 4 s free their
    slots together at +4 s, nothing before."""
    clock = FakeClock()
    forecast = _forecast_with_mean_hold(clock, 4.0)
    keys = [forecast.hold() for _ in range(8)]
    assert len(forecast) == 8
    assert forecast.releases_due(1, 2.0) is False
    clock.advance(2.5)
    assert forecast.releases_due(8, 2.0) is True, "due at +4 s, within 2 s of now (+2.5 s)"
    assert forecast.releases_due(9, 2.0) is False, "only 8 are held"
    for key in keys:
        forecast.release(key)
    assert len(forecast) == 0


def test_grants_are_counted_oldest_first() -> None:
    clock = FakeClock()
    forecast = _forecast_with_mean_hold(clock, 3.0)
    forecast.hold()  # due at +3
    clock.advance(1.0)
    young = forecast.hold()  # due at +4
    assert forecast.releases_due(1, 3.0 - 1.0) is True
    assert forecast.releases_due(2, 2.0) is False
    assert forecast.releases_due(2, 2.5) is False
    clock.advance(0.5)
    assert forecast.releases_due(2, 2.5) is True
    forecast.release(young)  # held 0.5 s: with smoothing 1.0, S is now 0.5 s
    assert forecast.mean_hold_s == pytest.approx(0.5)
    assert forecast.releases_due(1, 0.4) is True, "the older grant is overdue: due at once"
    assert forecast.releases_due(2, 0.4) is False, "a released grant no longer counts"


def test_mean_hold_time_is_smoothed_and_double_release_is_ignored() -> None:
    clock = FakeClock()
    forecast = ReleaseForecast(clock, smoothing=0.5)
    for hold_s in (2.0, 4.0):
        key = forecast.hold()
        clock.advance(hold_s)
        forecast.release(key)
        forecast.release(key)
    assert forecast.mean_hold_s == pytest.approx(3.0)
    with pytest.raises(ValueError):
        ReleaseForecast(clock, smoothing=0.0)


def test_a_discarded_grant_leaves_without_being_timed() -> None:
    clock = FakeClock()
    forecast = _forecast_with_mean_hold(clock, 4.0)
    key = forecast.hold()
    forecast.discard(key)
    forecast.discard(key)
    assert len(forecast) == 0 and forecast.mean_hold_s == pytest.approx(4.0)


def test_before_the_first_completion_the_prior_is_the_output_budget_times_the_token_latency() -> None:
    clock = FakeClock()
    per_token_s: list[float | None] = [None]
    forecast = ReleaseForecast(clock, smoothing=1.0, seconds_per_token=lambda: per_token_s[0])
    first = forecast.hold("r0", output_tokens=200)
    forecast.hold("r1", output_tokens=100)
    forecast.hold("r1")  # no budget: not in the prior
    assert forecast.mean_hold_s is None, "no token latency yet"
    per_token_s[0] = 0.04
    assert forecast.mean_hold_s == pytest.approx(150 * 0.04)
    assert forecast.releases_due(1, 1.0) is False, "dispatched now, due in 6 s"
    clock.advance(5.5)
    assert forecast.releases_due(3, 1.0) is True
    forecast.release(first)
    assert forecast.mean_hold_s == pytest.approx(5.5), "measured from the first completion on"
    forecast.hold("r0", output_tokens=10_000)
    assert forecast.mean_hold_s == pytest.approx(5.5)


def test_a_discarded_ticket_leaves_the_prior() -> None:
    forecast = ReleaseForecast(FakeClock(), seconds_per_token=lambda: 0.01)
    key = forecast.hold(output_tokens=1000)
    forecast.hold(output_tokens=100)
    forecast.discard(key)
    assert forecast.mean_hold_s == pytest.approx(1.0)
