"""The retry lane's book: places paced at share × the class's rate, a horizon, a claim window around the
due time, lapses, and the bound on what it keeps."""

import pytest

from admission import retry_lane
from admission.retry_lane import EARLY_S, GRACE_S, RetryLane


def test_places_are_paced_at_the_share_of_the_rate_in_whole_seconds() -> None:
    lane = RetryLane(share=0.5, horizon_s=10)  # 4 dispatches/s → 2 places/s, 0.5 s apart
    assert [lane.promise(key, 100.0, 4.0) for key in "abcde"] == [1, 2, 2, 3, 3]
    assert len(lane) == 5
    assert lane.stats.promised == 5


def test_the_schedule_restarts_from_now_when_it_has_fallen_behind() -> None:
    lane = RetryLane(share=1.0, horizon_s=10)
    assert lane.promise("a", 100.0, 1.0) == 1
    assert lane.promise("b", 100.0, 1.0) == 2
    assert lane.promise("c", 200.0, 1.0) == 1, "a place in the past is no place: at least 1 s from now"


def test_no_place_past_the_horizon_without_a_rate_or_with_the_lane_off() -> None:
    lane = RetryLane(share=1.0, horizon_s=3)
    assert [lane.promise(key, 0.0, 1.0) for key in "abcd"] == [1, 2, 3, None]
    assert lane.promise("e", 0.0, None) is None
    assert lane.promise("f", 0.0, 0.0) is None
    assert RetryLane(share=0.0).promise("g", 0.0, 10.0) is None
    assert lane.stats.unpromised == 3 and lane.stats.promised == 3


def test_a_retry_claims_its_place_from_just_before_its_due_time_once() -> None:
    lane = RetryLane(share=0.5, horizon_s=10)
    assert lane.promise("a", 100.0, 1.0) == 1  # due at 101
    assert not lane.claim("a", 101.0 - EARLY_S - 0.01), "too early: a fresh arrival"
    assert len(lane) == 1, "an early retry keeps its place"
    assert not lane.claim("other", 101.0)
    assert lane.claim("a", 101.0 - EARLY_S)
    assert not lane.claim("a", 101.0), "used up"
    assert lane.stats.claimed == 1


def test_a_place_lapses_after_the_grace() -> None:
    lane = RetryLane(share=0.5, horizon_s=10)
    lane.promise("a", 100.0, 1.0)
    assert not lane.claim("a", 101.0 + GRACE_S + 0.01)
    assert len(lane) == 0 and lane.stats.lapsed == 1


def test_a_key_refused_again_is_promised_anew() -> None:
    lane = RetryLane(share=1.0, horizon_s=10)
    assert lane.promise("a", 100.0, 1.0) == 1
    assert lane.promise("a", 100.5, 1.0) == 2  # the schedule's next place: 102
    assert len(lane) == 1
    assert not lane.claim("a", 101.0), "the old place is gone"
    assert lane.claim("a", 102.5)


def test_the_book_keeps_at_most_max_promises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry_lane, "MAX_PROMISES", 3)
    lane = RetryLane(share=1.0, horizon_s=100)
    for key in "abcd":
        lane.promise(key, 0.0, 10.0)
    assert len(lane) == 3 and lane.stats.lapsed == 1
    assert not lane.claim("a", 1.0), "the oldest went first"
    assert lane.claim("d", 2.0)


@pytest.mark.parametrize(("share", "horizon_s"), [(-0.1, 10.0), (1.1, 10.0), (0.5, 0.5)])
def test_bad_settings_are_refused(share: float, horizon_s: float) -> None:
    with pytest.raises(ValueError):
        RetryLane(share=share, horizon_s=horizon_s)


def test_no_place_before_the_slots_it_needs_are_forecast_to_free() -> None:
    lane = RetryLane(share=1.0, horizon_s=5)
    assert lane.promise("a", 100.0, 10.0, not_before_s=2.5) == 3
    assert lane.promise("b", 100.0, 10.0, not_before_s=0.2) == 3, "after the places booked before it"
    assert lane.promise("c", 100.0, 10.0, not_before_s=9.0) is None, "the slots free past the horizon"
