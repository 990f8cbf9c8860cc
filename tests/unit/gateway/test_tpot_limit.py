"""The gradient concurrency limit on a replica's measured TPOT (gateway/upstream/tpot_limit.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core.clock import FakeClock
from gateway.config.latency_settings import LatencyModelSettings
from gateway.upstream.replica_cost import AFFINITY_SHARE_WEIGHT, ReplicaCost
from gateway.upstream.tpot_limit import (
    BIRTH_BATCH_RATIO,
    WINDOW_CEILING_RATIO,
    WINDOW_GAIN,
    WINDOW_HEADROOM,
    WINDOW_SMOOTHING,
    TpotConcurrencyLimit,
)

SLO_S = 0.05


def feed(limit: TpotConcurrencyLimit, tpot_s: float, inflight: int, samples: int = 8) -> None:
    for _ in range(samples):
        limit.observe(tpot_s, inflight)


def test_no_limit_while_the_objective_holds() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4)
    feed(limit, 0.03, inflight=100, samples=64)
    assert limit.cap is None


def test_a_broken_objective_starts_the_limit_from_what_runs_now_scaled_by_the_gradient() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4)
    feed(limit, 0.0625, inflight=100)  # gradient 0.05 / 0.0625 = 0.8
    assert limit.cap == 80
    feed(limit, 0.0625, inflight=80)  # still broken: 80 × 0.8
    assert limit.cap == 64


def test_it_shrinks_at_most_by_half_and_never_below_the_floor() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=10)
    feed(limit, 1.0, inflight=100)  # gradient clamped to 0.5
    assert limit.cap == 50
    for _ in range(10):
        feed(limit, 1.0, inflight=50)
    assert limit.cap == 10


def test_while_the_objective_holds_it_grows_by_the_square_root_up_to_the_configured_cap() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, max_limit=70)
    feed(limit, 0.1, inflight=128)  # → 64
    assert limit.cap == 64
    feed(limit, 0.001, inflight=64, samples=40)  # the mean falls below the objective within a few updates
    assert limit.cap == 70
    grown = TpotConcurrencyLimit(SLO_S, min_limit=4)
    feed(grown, 0.1, inflight=128)
    grown.limit = 64.0
    grown._tpot_s = 0.01  # a held objective, exactly
    feed(grown, 0.01, inflight=64)
    assert grown.limit == pytest.approx(64 + math.sqrt(64))


def test_a_set_point_below_the_objective_limits_a_tpot_that_still_meets_the_objective() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=0.8)  # aims at 40 ms
    feed(limit, 0.045, inflight=90)  # within the 50 ms objective, above the 40 ms target
    assert limit.cap == 80  # 90 × 0.04 / 0.045
    at_objective = TpotConcurrencyLimit(SLO_S, min_limit=4)
    feed(at_objective, 0.045, inflight=90)
    assert at_objective.cap is None


@pytest.mark.parametrize("ratio", [0.0, -0.5, 1.2])
def test_a_set_point_outside_zero_to_one_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match="target_ratio"):
        TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=ratio)


def test_paced_updates_take_their_share_of_a_generation_but_the_first_cut_is_whole() -> None:
    """With n requests running an update is 8 / n of a generation's step: × gradient^(8/n), the
    gradient up to 2 while TPOT is below the set point, plus (8/n) × √limit while held."""
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, paced=True)
    feed(limit, 0.1, inflight=128)  # first cut, whole: 128 × 0.5
    assert limit.limit == pytest.approx(64.0)
    limit._tpot_s = 0.1
    feed(limit, 0.1, inflight=64)  # share 8 / 64: 64 × 0.5^(1/8)
    assert limit.limit == pytest.approx(64.0 * 0.5**0.125)
    limit.limit, limit._tpot_s = 64.0, 0.01
    feed(limit, 0.01, inflight=64)  # held, TPOT a fifth of the set point: gradient 2, 64 × 2^(1/8) + √64 / 8
    assert limit.limit == pytest.approx(64.0 * 2**0.125 + 1.0)
    limit.limit = 4.0
    feed(limit, 0.01, inflight=4)  # below update_every the share is whole: 4 × 2 + √4, bounded at 2 × 4
    assert limit.limit == pytest.approx(8.0)


def test_paced_growth_stops_at_twice_what_runs() -> None:
    """A limit nothing presses on (a quiet night) learns nothing about larger batches: it stays put."""
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, paced=True)
    feed(limit, 0.1, inflight=128)  # 64
    limit._tpot_s = 0.01
    for _ in range(50):
        feed(limit, 0.01, inflight=20)
    assert limit.limit == pytest.approx(64.0)


def test_paced_cuts_over_one_generation_compound_to_about_one_step() -> None:
    paced, unpaced = (TpotConcurrencyLimit(SLO_S, min_limit=1, paced=p) for p in (True, False))
    for limit in (paced, unpaced):
        feed(limit, 0.1, inflight=80)  # the first cut: 40
        feed(limit, 0.1, inflight=80, samples=40)  # half a generation of stale samples, 80 still running
    assert unpaced.cap == 1  # five whole halvings: 40 / 32, floored at the minimum
    assert paced.cap == 28  # five tenths of one: 40 × 0.5^0.5


def test_the_pool_setting_reaches_the_replica_limit() -> None:
    cost = ReplicaCost(LatencyModelSettings(adaptive_cap=True, tpot_target_ratio=0.8), tpot_slo_s=SLO_S)
    for _ in range(8):
        cost.learn_tpot(10.0, None, 0.045, inflight=90)
    assert cost.learned_cap == 80


def test_updates_only_every_n_samples_and_ignores_bad_samples() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, update_every=8)
    feed(limit, 0.1, inflight=100, samples=7)
    assert limit.cap is None
    limit.observe(math.nan, 100)
    limit.observe(-1.0, 100)
    assert limit.cap is None
    limit.observe(0.1, 100)
    assert limit.cap == 50


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError):
        TpotConcurrencyLimit(0.0, min_limit=1)
    with pytest.raises(ValueError):
        TpotConcurrencyLimit(SLO_S, min_limit=0)


def test_the_replica_cap_follows_the_gradient_limit_once_the_objective_breaks() -> None:
    cost = ReplicaCost(LatencyModelSettings(warm_after=4, adaptive_cap=True), tpot_slo_s=SLO_S)
    for _ in range(8):
        cost.learn_tpot(running=90, engine=None, tpot_s=0.1, inflight=100)
    assert cost.learned_cap == 50
    off = ReplicaCost(LatencyModelSettings(adaptive_cap=False), tpot_slo_s=SLO_S)
    for _ in range(8):
        off.learn_tpot(running=90, engine=None, tpot_s=0.1, inflight=100)
    assert off.learned_cap is None


def test_reset_forgets_the_limit_until_the_objective_breaks_again() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4)
    feed(limit, 0.1, inflight=100)
    assert limit.cap == 50
    limit.reset()
    assert limit.cap is None
    feed(limit, 0.03, inflight=100)
    assert limit.cap is None


def _capped_cost(**settings: Any) -> tuple[ReplicaCost, FakeClock]:
    clock = FakeClock(0.0)
    cost = ReplicaCost(LatencyModelSettings(adaptive_cap=True, **settings), tpot_slo_s=SLO_S, clock=clock)
    return cost, clock


def _run(cost: ReplicaCost, clock: FakeClock, *, affinity: int, prompt: int, tpot_s: float, n: int) -> None:
    for _ in range(n):
        cost.dispatched(100, None, inflight=100, prompt_tokens=prompt, affinity_tokens=affinity)
        clock.advance(0.01)
        cost.learn_tpot(90, None, tpot_s, inflight=100)


def test_the_affinity_share_is_a_weighted_mean_of_what_some_replicas_hold_and_others_not() -> None:
    cost, _ = _capped_cost()
    assert cost.affinity_share is None
    cost.dispatched(200, None, inflight=0, prompt_tokens=1000, affinity_tokens=800)
    assert cost.affinity_share == pytest.approx(0.8)  # the first dispatch sets it
    cost.dispatched(1000, None, inflight=0, prompt_tokens=1000, affinity_tokens=0)
    assert cost.affinity_share == pytest.approx(0.8 + AFFINITY_SHARE_WEIGHT * (0.0 - 0.8))
    cost.dispatched(50, None, inflight=0, prompt_tokens=1000)  # the policy did not say: no change
    cost.dispatched(50, None, inflight=0, prompt_tokens=0, affinity_tokens=0)
    assert cost.affinity_share == pytest.approx(0.784)


def test_the_affinity_gate_when_set_drops_the_cap_where_the_choice_of_replica_decides_the_prefill() -> None:
    """With `cap_max_affinity_share: 0.25`: 3 in 4 prompt tokens held by some replicas and not others
    set no cap, while the same TPOTs where every replica holds the same (a common system prompt) or
    none does, do."""
    shared, clock = _capped_cost(cap_max_affinity_share=0.25)
    _run(shared, clock, affinity=1500, prompt=2000, tpot_s=0.1, n=32)
    assert shared.learned_cap is None
    common, clock = _capped_cost(cap_max_affinity_share=0.25)
    _run(common, clock, affinity=0, prompt=2000, tpot_s=0.1, n=8)
    assert common.learned_cap == 50
    _run(common, clock, affinity=2000, prompt=2000, tpot_s=0.1, n=200)  # affinity rises past 1/4
    assert common.affinity_share is not None and common.affinity_share > 0.25
    assert common.learned_cap is None  # the limit is dropped, not frozen
    unknown, clock = _capped_cost(cap_max_affinity_share=0.25)  # no prefix index: no share, capped
    for _ in range(8):
        unknown.dispatched(100, None, inflight=100, prompt_tokens=2000)
        unknown.learn_tpot(90, None, 0.1, inflight=100)
    assert unknown.affinity_share is None and unknown.learned_cap == 50
    everywhere, clock = _capped_cost()  # the default: no gate, the cap whatever the sharing
    _run(everywhere, clock, affinity=1500, prompt=2000, tpot_s=0.1, n=8)
    assert everywhere.learned_cap == 50


# Fast samples: the engine's own token latency per scrape window (observe_window).


def test_a_fast_sample_over_target_cuts_from_the_batch_that_ran_once() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, window_smoothing=1.0)
    limit.observe_window(0.025, batch=60)  # under the objective: nothing to limit yet
    assert limit.cap is None
    limit.observe_window(0.0625, batch=100)  # the onset: a damped step, 100 × 0.8^gain
    first = 100 * 0.8**WINDOW_GAIN
    assert limit.limit == pytest.approx(first)
    limit.observe_window(0.0625, batch=100)  # still over, the batch has not drained: no further cut
    assert limit.limit == pytest.approx(first), "anchored to the batch, cuts do not compound"
    limit.observe_window(0.06, batch=110)  # a bigger batch, still over: a cut never raises the limit
    assert limit.limit == pytest.approx(first)
    limit.observe_window(0.0625, batch=80)  # drained below it and still over: a damped step from there
    assert limit.limit == pytest.approx(80 * 0.8**WINDOW_GAIN)


def test_cuts_anchored_to_the_batch_do_not_compound_while_it_drains() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, window_smoothing=1.0)
    limit.observe_window(0.1, batch=100)  # gradient 0.5: the first cut, 100 × 0.5^gain = 81
    first = limit.limit
    for _ in range(10):  # the batch has not drained; the latency falls as the cold prompts pass
        limit.observe_window(0.06, batch=100)
    assert limit.limit == pytest.approx(first), "100 × (0.05 / 0.06)^gain is above it: no further cut"
    unanchored = first * (0.05 / 0.06) ** (WINDOW_GAIN * 10)
    assert unanchored < 0.6 * first, "compounded, the same samples would have taken it far lower"


def test_under_target_it_grows_with_the_batch_but_not_past_the_headroom() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, window_smoothing=1.0)
    limit.observe_window(0.1, batch=60)  # 60 × 0.5^gain ≈ 48.7
    limit.observe_window(0.025, batch=40)  # gradient 2 at a binding limit: 40 × 2^gain, under the headroom
    assert limit.limit == pytest.approx(min(40 * 2**WINDOW_GAIN, WINDOW_HEADROOM * 40))
    for _ in range(20):  # demand fell: 10 running, latency low
        limit.observe_window(0.01, batch=10)
    assert limit.cap == math.floor(WINDOW_HEADROOM * 10), "a limit far above what runs lets a burst through"


def test_fast_samples_take_over_from_finished_requests_tpots() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4, window_smoothing=1.0)
    limit.observe_window(0.1, batch=100)
    cap = limit.cap
    assert limit.windowed and cap == math.floor(100 * 0.5**WINDOW_GAIN)
    feed(limit, 0.01, inflight=50, samples=64)  # a generation-old view: ignored
    assert limit.cap == cap
    limit.observe_window(math.nan, batch=50)
    limit.observe_window(0.0, batch=50)
    assert limit.cap == cap
    limit.reset()
    assert not limit.windowed and limit.cap is None


def test_the_fast_limit_steers_a_smoothed_latency_so_one_slow_window_cuts_nothing() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4)  # default smoothing
    for _ in range(8):
        limit.observe_window(0.03, batch=60)
    limit.observe_window(0.08, batch=60)  # one window caught a long prefill step
    assert limit.cap is None, f"smoothed: 0.03 + {WINDOW_SMOOTHING} × 0.05 is under the objective"
    for _ in range(4):  # sustained: it cuts
        limit.observe_window(0.08, batch=60)
    assert limit.cap is not None and limit.cap < 60


def test_no_limit_is_born_under_twice_the_floor() -> None:
    """A cold engine's first windows carry its first requests' full prefills: a cut there would land on
    the floor, from where the limit regrows by under a request a window."""
    limit = TpotConcurrencyLimit(SLO_S, min_limit=8, window_smoothing=1.0)
    for batch in range(1, int(BIRTH_BATCH_RATIO * 8)):
        limit.observe_window(0.1, batch=batch)  # twice the objective, the batch building
        assert limit.limit is None, batch
    limit.observe_window(0.1, batch=BIRTH_BATCH_RATIO * 8)
    assert limit.limit == pytest.approx(BIRTH_BATCH_RATIO * 8 * 0.5**WINDOW_GAIN)
    assert limit.cap is not None and limit.cap > 8, "born above the floor"


def test_a_stall_is_held_to_twice_the_set_point_so_the_limit_regrows_once_it_ends() -> None:
    """An engine stalled on its prefill queue shows windows of many times the set point; the cut is the
    same (the gradient's floor) but their memory would hold the limit down long after the stall."""

    def windows_to_regrow(stall_s: float) -> int:
        limit = TpotConcurrencyLimit(SLO_S, min_limit=4)  # default smoothing
        for _ in range(8):
            limit.observe_window(stall_s, batch=40)
        cut = limit.limit
        assert cut == pytest.approx(40 * 0.5**WINDOW_GAIN)
        for window in range(1, 40):
            limit.observe_window(0.02, batch=40)  # the stall has ended; the batch fills the limit
            if limit.limit is not None and limit.limit > cut:
                return window
        return 40

    held = windows_to_regrow(WINDOW_CEILING_RATIO * SLO_S)
    assert windows_to_regrow(20 * SLO_S) == held, "a longer stall's windows weigh no more"
    unheld = 1 + math.ceil(math.log((SLO_S - 0.02) / (20 * SLO_S - 0.02)) / math.log(1 - WINDOW_SMOOTHING))
    assert held <= 5  # the measured windows' mean would stay over the set point for `unheld` windows
    assert unheld > 10


def test_finished_requests_trim_the_fast_set_point_towards_the_objectives_quantile() -> None:
    """The fast limit holds the engine's mean token latency at its set point; finished requests whose
    TPOT quantile sits well inside the objective raise it (more batch), ones over it lower it."""
    from gateway.upstream.set_point_trim import ATTAINMENT_EVERY, ATTAINMENT_SAMPLES, TRIM_BOUNDS

    loose = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=0.8, window_smoothing=1.0)
    loose.observe_window(0.045, batch=100)  # over the 40 ms set point: fast samples from now on
    for _ in range(ATTAINMENT_SAMPLES + 4 * ATTAINMENT_EVERY):
        loose.observe(0.03, inflight=80)  # requests see 30 ms: far inside the 50 ms objective
    assert loose.set_point_s == pytest.approx(TRIM_BOUNDS[1] * SLO_S), "trimmed up to its ceiling, 45 ms"
    loose.observe_window(0.043, batch=80)
    assert loose.limit is not None and loose.limit > 80, "43 ms is now under the trimmed set point"
    tight = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=0.8, window_smoothing=1.0)
    tight.observe_window(0.03, batch=100)  # under the set point: no limit, but fast samples
    for _ in range(ATTAINMENT_SAMPLES + 20 * ATTAINMENT_EVERY):
        tight.observe(0.07, inflight=80)  # requests see 70 ms: the objective broken
    tight.observe_window(0.03, batch=100)
    floor_s = TRIM_BOUNDS[0] * SLO_S  # trimmed down to its floor, 25 ms: 30 ms is now over it
    assert tight.limit == pytest.approx(100 * (floor_s / 0.03) ** WINDOW_GAIN)


def test_the_set_point_is_trimmed_up_only_while_the_latency_is_held_at_it() -> None:
    """Below the knee (the latency well under the set point, no limit) finished requests far inside the
    objective say nothing of the set point: it stays where it started. Held at it, they raise it; over
    the objective, they lower it whatever the latency."""
    from gateway.upstream.set_point_trim import ATTAINMENT_EVERY, ATTAINMENT_SAMPLES

    light = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=0.8, window_smoothing=1.0)
    light.observe_window(0.02, batch=40)  # half the 40 ms set point: no limit, fast samples
    for _ in range(ATTAINMENT_SAMPLES + 8 * ATTAINMENT_EVERY):
        light.observe(0.02, inflight=40)
    assert light.set_point_s == pytest.approx(0.04) and light.cap is None
    held = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=0.8, window_smoothing=1.0)
    held.observe_window(0.038, batch=90)  # at the set point
    for _ in range(ATTAINMENT_SAMPLES + 8 * ATTAINMENT_EVERY):
        held.observe(0.03, inflight=90)
    # one step up (× 1.25^½); then 38 ms is no longer within 10 % of the new set point: no further
    assert held.set_point_s == pytest.approx(0.04 * 1.25**0.5)
    missed = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=0.8, window_smoothing=1.0)
    missed.observe_window(0.02, batch=40)
    for _ in range(ATTAINMENT_SAMPLES + 2 * ATTAINMENT_EVERY):
        missed.observe(0.07, inflight=40)
    assert missed.set_point_s < 0.04


def test_before_fast_samples_finished_requests_still_move_the_limit_not_the_set_point() -> None:
    limit = TpotConcurrencyLimit(SLO_S, min_limit=4)
    feed(limit, 0.1, inflight=100)
    assert limit.cap == 50 and not limit.windowed


def test_the_trim_raises_the_set_point_no_higher_than_its_ceiling_nor_lowers_one_started_above() -> None:
    """Up to 0.9 × the objective (a generation-old view of the requests steers at most there); a set
    point an operator started higher (`tpot_target_ratio`) is not lowered for being high."""
    from gateway.upstream.set_point_trim import ATTAINMENT_EVERY, ATTAINMENT_SAMPLES, TRIM_BOUNDS

    for ratio, settled in ((0.8, TRIM_BOUNDS[1]), (1.0, 1.0)):
        limit = TpotConcurrencyLimit(SLO_S, min_limit=4, target_ratio=ratio, window_smoothing=1.0)
        limit.observe_window(0.99 * ratio * SLO_S, batch=100)  # held at the set point: fast samples
        for _ in range(ATTAINMENT_SAMPLES + 8 * ATTAINMENT_EVERY):
            limit.observe(0.02, inflight=80)  # far inside the objective
            limit.observe_window(0.99 * limit.set_point_s, batch=100)
        assert limit.set_point_s == pytest.approx(settled * SLO_S), ratio


def test_the_trim_takes_its_quantile_over_at_least_its_floor_of_requests_whatever_the_share() -> None:
    """An instance that sends a replica almost nothing still trims on `MIN_ATTAINMENT_SAMPLES` of its
    own requests, not on one or none."""
    from gateway.upstream.set_point_trim import MIN_ATTAINMENT_SAMPLES, SetPointTrim

    trim = SetPointTrim(SLO_S, 0.04)
    set_point_s = 0.04
    for _ in range(MIN_ATTAINMENT_SAMPLES - 1):
        set_point_s = trim.trimmed(0.03, set_point_s, latency_s=0.039, share=0.001)
    assert set_point_s == 0.04
    assert trim.trimmed(0.03, set_point_s, latency_s=0.039, share=0.001) == pytest.approx(0.04 * 1.25**0.5)
