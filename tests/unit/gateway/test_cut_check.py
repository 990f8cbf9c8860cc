"""The check that stops the learned cap's futile cuts (gateway/upstream/cut_check.py), alone and in the
fast limit it guards (gateway/upstream/tpot_limit.py)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import pytest

from gateway.upstream.cut_check import (
    FUTILE_MARGIN,
    PROBE_AFTER_WINDOWS,
    PROBE_FACTOR,
    PROBE_MAX_WINDOWS,
    SETTLE_WINDOWS,
    CutCheck,
)
from gateway.upstream.tpot_limit import BIRTH_BATCH_RATIO, TpotConcurrencyLimit

SLO_S = 0.05
SET_POINT_S = 0.04  # SLO_S × 0.8


def settle(check: CutCheck, latency_s: float, batch: float) -> bool:
    """`SETTLE_WINDOWS` windows at one batch and latency: the verdict of the last."""
    verdicts = [check.window(latency_s, batch, SET_POINT_S) for _ in range(SETTLE_WINDOWS)]
    assert not any(verdicts[:-1]), "judged before the batch had settled"
    return verdicts[-1]


def test_a_run_of_cuts_is_judged_once_the_batch_has_halved() -> None:
    check = CutCheck()
    assert not check.window(0.06, 100, SET_POINT_S)  # the first cut opens the check at (100, 60 ms)
    assert check.open
    assert not settle(check, 0.06, 51)  # not halved yet
    assert not check.window(0.06, 50, SET_POINT_S)  # halved, not settled
    check.window(0.06, 52, SET_POINT_S)  # back over half: the settling starts again
    assert settle(check, 0.06, 50)  # halved and settled, no change: the floor is 60 ms
    assert check.reachable_s == pytest.approx(FUTILE_MARGIN * 0.06)
    assert check.futile_batch == 100
    assert check.set_point_s(SET_POINT_S) == pytest.approx(0.066)


def test_the_floor_is_where_the_line_through_the_two_windows_meets_no_batch() -> None:
    paid = CutCheck()
    paid.window(0.06, 100, SET_POINT_S)
    # slope (60 − 49.9) / 50 ms per request: floor 49.9 − 50 × 0.202 = 39.8 ms, under the set point
    assert not settle(paid, 0.0499, 50)
    assert paid.reachable_s is None and not paid.open
    futile = CutCheck()
    futile.window(0.055, 100, SET_POINT_S)
    # slope (55 − 50.1) / 50: floor 50.1 − 50 × 0.098 = 45.2 ms, over it, and the latency within 10 %
    assert settle(futile, 0.0501, 50)
    reachable_flat = CutCheck()
    reachable_flat.window(0.046, 400, SET_POINT_S)
    # within 10 %, but slope (46 − 42) / 200: floor 42 − 200 × 0.02 = 38 ms, under it: a batch reaches it
    assert not settle(reachable_flat, 0.042, 200)


def test_a_latency_that_moved_while_the_batch_halved_moved_for_another_reason_and_gives_no_verdict() -> None:
    rose = CutCheck()
    rose.window(0.05, 100, SET_POINT_S)
    assert not settle(rose, 0.07, 40)  # a prefill burst while the batch drained
    fell = CutCheck()
    fell.window(0.20, 40, SET_POINT_S)  # a prefill spike, then a cohort ending together
    assert not settle(fell, 0.15, 20)  # the line's floor is 100 ms, but the latency fell by a quarter
    assert rose.reachable_s is None and fell.reachable_s is None


def test_a_window_at_the_set_point_ends_the_run_and_the_next_run_starts_afresh() -> None:
    check = CutCheck()
    check.window(0.06, 100, SET_POINT_S)
    check.window(0.04, 90, SET_POINT_S)  # the cuts reached the set point
    assert not check.open
    assert not settle(check, 0.06, 45)  # opens at 45, not judged against 100
    assert not settle(check, 0.06, 30)
    assert settle(check, 0.06, 22)
    assert check.futile_batch == 45


def test_the_verdict_holds_until_the_latency_falls_under_the_set_point() -> None:
    check = CutCheck()
    check.window(0.06, 100, SET_POINT_S)
    assert settle(check, 0.06, 50)
    check.window(0.05, 50, SET_POINT_S)  # under the reachable 66 ms, over the set point: it holds
    assert check.reachable_s is not None
    check.window(0.039, 50, SET_POINT_S)
    assert check.reachable_s is None and check.futile_batch is None
    assert check.set_point_s(SET_POINT_S) == SET_POINT_S


def test_a_later_run_of_cuts_that_reaches_under_the_set_point_clears_a_verdict_taken_on_a_transient() -> None:
    check = CutCheck()
    check.window(0.10, 16, SET_POINT_S)
    assert settle(check, 0.10, 8)  # cold prefills while the batch drained: "futile", 110 ms
    check.window(0.22, 80, SET_POINT_S)  # the load grew past it: a run of cuts against 110 ms
    assert not settle(check, 0.12, 40)  # slope 2.5 ms a request: floor 20 ms, under 40
    assert check.reachable_s is None and check.set_point_s(SET_POINT_S) == SET_POINT_S


def test_an_idle_engine_opens_no_check() -> None:
    check = CutCheck()
    assert not check.window(0.06, 0, SET_POINT_S)
    assert not check.open


def closed_loop(
    latency_at: Callable[[float], float],
    demand: Callable[[int], float],
    windows: int,
    *,
    drain_per_window: float = 8.0,
    min_limit: int = 8,
) -> tuple[TpotConcurrencyLimit, list[float]]:
    """An engine whose token latency is `latency_at(batch)`, with `demand(window)` requests wanting to
    run: a raised limit fills at once, a cut drains as requests finish (`drain_per_window` a window).
    Returns the limit and the batch of every window."""
    limit = TpotConcurrencyLimit(SLO_S, min_limit=min_limit, target_ratio=0.8)
    batch = demand(0)
    batches = []
    for step in range(windows):
        wanted = demand(step)
        cap = limit.cap
        allowed = wanted if cap is None else min(wanted, float(cap))
        batch = allowed if allowed >= batch else max(allowed, batch - drain_per_window)
        batches.append(batch)
        limit.observe_window(latency_at(batch), batch)
    return limit, batches


def test_an_engine_slower_than_the_set_point_at_every_batch_is_not_throttled_to_the_floor() -> None:
    limit, batches = closed_loop(lambda batch: 0.05, lambda step: 200.0, windows=200)
    # without the check the cuts follow the draining batch to the floor (8) and stay there
    assert min(batches) >= 70  # one run of cuts, undone once the batch had halved and settled (78)
    assert batches[-1] == 200
    assert limit.steered_set_point_s == pytest.approx(FUTILE_MARGIN * 0.05)


def test_a_reachable_set_point_is_still_held_and_no_verdict_is_given() -> None:
    def latency_at(batch: float) -> float:
        return 0.02 + 0.0002 * batch  # the set point (40 ms) at a batch of 100

    limit, batches = closed_loop(latency_at, lambda step: 300.0, windows=300)
    assert limit.steered_set_point_s == pytest.approx(SET_POINT_S)
    assert 80 <= batches[-1] <= 110
    assert latency_at(batches[-1]) <= 0.042


def test_after_a_futile_verdict_a_further_rise_in_load_is_still_held() -> None:
    def latency_at(batch: float) -> float:
        return 0.045 + 0.0001 * batch  # over the set point at any batch: 55 ms at 100

    def demand(step: int) -> float:
        return 100.0 if step < 150 else 400.0

    limit, batches = closed_loop(latency_at, demand, windows=400)
    assert min(batches[:150]) >= 35 and batches[149] == 100  # the cuts found futile, undone
    reachable_s = limit.steered_set_point_s
    assert reachable_s > SET_POINT_S
    assert batches[-1] < 200  # the rise to 400 is held near where the latency meets the reachable set point
    assert latency_at(batches[-1]) <= reachable_s * 1.1


def test_a_cap_at_the_floor_since_a_cold_start_is_probed_and_the_flat_latency_read_as_a_floor() -> None:
    def demand(step: int) -> float:
        return min(47.0, 1.0 + step)  # the load builds one request a window: the cuts reach the floor

    limit, batches = closed_loop(lambda batch: 0.05, demand, windows=120)
    born = batches.index(BIRTH_BATCH_RATIO * 8)  # no limit under twice the floor
    at_floor = batches.index(8.0, born)  # the cuts follow the batch down while nothing is judged
    first_probe = batches.index(PROBE_FACTOR * 8, at_floor)
    assert max(batches[:first_probe]) == BIRTH_BATCH_RATIO * 8
    assert set(batches[at_floor:first_probe]) == {8.0}, "at the floor until the probe"
    assert first_probe <= at_floor + PROBE_AFTER_WINDOWS + 1
    assert batches[-1] == 47, "served at the load it has"
    assert not limit.held_near_floor
    assert limit.steered_set_point_s == pytest.approx(FUTILE_MARGIN * 0.05)


def test_a_probe_that_raises_the_latency_ends_and_the_next_waits_twice_as_long() -> None:
    def latency_at(batch: float) -> float:
        return 0.03 + 0.002 * batch  # 46 ms at the floor, 62 at twice it: the batch costs

    limit, batches = closed_loop(latency_at, lambda step: 47.0, windows=300)
    starts = [i for i in range(1, len(batches)) if batches[i] == 16 and batches[i - 1] < 16]
    assert len(starts) >= 3
    gaps = [later - earlier for earlier, later in pairwise(starts)]
    assert all(later > 1.5 * earlier for earlier, later in pairwise(gaps)), gaps
    assert limit.steered_set_point_s == pytest.approx(SET_POINT_S), "no verdict"
    assert batches[-1] <= 16
    assert limit.held_near_floor, "the alert's gauge: held at the floor, the latency over the set point"


def test_a_probe_the_demand_does_not_fill_ends_unread() -> None:
    check = CutCheck(floor=8)
    for _ in range(PROBE_AFTER_WINDOWS):
        check.window(0.06, 8, SET_POINT_S, limit=8.0)
    assert check.probe_level == 16
    for _ in range(PROBE_MAX_WINDOWS):
        assert not check.window(0.06, 9, SET_POINT_S, limit=16.0)
    assert check.probe_level is None and check.reachable_s is None
    for _ in range(2 * PROBE_AFTER_WINDOWS - 1):  # the next probe waits twice as long
        check.window(0.06, 8, SET_POINT_S, limit=8.0)
    assert check.probe_level is None
    check.window(0.06, 8, SET_POINT_S, limit=8.0)
    assert check.probe_level == 16


@pytest.mark.parametrize(("drained_ratio", "futile"), [(3.0, True), (2.5, False)])
def test_the_check_judges_the_latency_as_measured_not_as_held_for_the_limit(
    drained_ratio: float, futile: bool
) -> None:
    """The limit steers windows held to twice the set point; a drain from three times the set point to
    two and a half did lower the latency, which the held windows (both at twice) would not show."""
    limit = TpotConcurrencyLimit(SLO_S, min_limit=8, target_ratio=0.8, window_smoothing=1.0)
    limit.observe_window(3.0 * SET_POINT_S, batch=100)  # the first cut opens the check
    for _ in range(SETTLE_WINDOWS + 1):
        limit.observe_window(drained_ratio * SET_POINT_S, batch=50)
    verdict = limit.steered_set_point_s > 1.01 * SET_POINT_S  # else the set point itself
    assert verdict is futile
