"""Arrival processes: deterministic under a seed, the promised mean rate and shape."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from bench.arrivals import (
    ClosedLoop,
    Constant,
    Gamma,
    Poisson,
    StepSpike,
    TraceTimes,
    describe,
    make_arrivals,
)


def take(process: Poisson | Gamma | Constant | StepSpike | TraceTimes, n: int, seed: int = 1) -> list[float]:
    return list(itertools.islice(process.offsets_s(random.Random(seed)), n))


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]


def test_same_seed_same_offsets_different_seed_different() -> None:
    for process in (Poisson(5.0), Gamma(5.0, 0.5), StepSpike(5.0, 3.0, 2.0, 2.0)):
        assert take(process, 50, seed=3) == take(process, 50, seed=3)
        assert take(process, 50, seed=3) != take(process, 50, seed=4)


def test_offsets_increase() -> None:
    for process in (Poisson(5.0), Gamma(5.0, 0.3), Constant(5.0), StepSpike(5.0)):
        offsets = take(process, 200)
        assert all(b >= a for a, b in itertools.pairwise(offsets))


def test_poisson_mean_rate_and_exponential_gaps() -> None:
    g = gaps(take(Poisson(10.0), 20_000))
    assert statistics.fmean(g) == pytest.approx(0.1, rel=0.03)
    cv2 = statistics.pvariance(g) / statistics.fmean(g) ** 2
    assert cv2 == pytest.approx(1.0, rel=0.1)  # exponential: CV² = 1


def test_gamma_keeps_the_rate_and_sets_burstiness() -> None:
    for shape in (0.25, 1.0, 4.0):
        g = gaps(take(Gamma(10.0, shape), 20_000))
        assert statistics.fmean(g) == pytest.approx(0.1, rel=0.05)
        cv2 = statistics.pvariance(g) / statistics.fmean(g) ** 2
        assert cv2 == pytest.approx(1.0 / shape, rel=0.15)  # gamma: CV² = 1/shape


def test_constant_is_evenly_spaced() -> None:
    assert take(Constant(4.0), 4) == [0.25, 0.5, 0.75, 1.0]


def test_step_spike_multiplies_the_rate_inside_the_window_only() -> None:
    process = StepSpike(rate_per_s=20.0, factor=3.0, start_s=10.0, duration_s=10.0)
    offsets = list(itertools.takewhile(lambda t: t < 30.0, process.offsets_s(random.Random(7))))
    before = sum(1 for t in offsets if t < 10.0)
    during = sum(1 for t in offsets if 10.0 <= t < 20.0)
    after = sum(1 for t in offsets if t >= 20.0)
    assert before == pytest.approx(200, rel=0.2)
    assert during == pytest.approx(600, rel=0.12)
    assert after == pytest.approx(200, rel=0.2)
    assert process.rate_at(15.0) == 60.0 and process.rate_at(25.0) == 20.0


def test_step_inverse_integrated_rate_is_exact_at_the_edges() -> None:
    process = StepSpike(rate_per_s=2.0, factor=5.0, start_s=10.0, duration_s=4.0)
    assert process._inverse_integrated_rate(20.0) == pytest.approx(10.0)  # 2/s × 10 s
    assert process._inverse_integrated_rate(60.0) == pytest.approx(14.0)  # + 10/s × 4 s
    assert process._inverse_integrated_rate(62.0) == pytest.approx(15.0)


def test_trace_times_replay_and_rate() -> None:
    trace = TraceTimes((0.0, 0.5, 1.0, 2.0))
    assert take(trace, 10) == [0.0, 0.5, 1.0, 2.0]
    assert trace.offered_rate_per_s == pytest.approx(1.5)


def test_make_arrivals_and_describe() -> None:
    assert make_arrivals("poisson", 3.0) == Poisson(3.0)
    assert make_arrivals("gamma", 3.0, burstiness=0.5) == Gamma(3.0, 0.5)
    assert make_arrivals("closed", 8) == ClosedLoop(8)
    assert make_arrivals("step", 2.0, spike_factor=4.0) == StepSpike(2.0, 4.0, 10.0, 10.0)
    assert describe(Gamma(3.0, 0.5)) == {"kind": "gamma", "rate_per_s": 3.0, "burstiness": 0.5}
    assert describe(ClosedLoop(4)) == {"kind": "closed", "concurrency": 4}
    with pytest.raises(ValueError, match="unknown arrival"):
        make_arrivals("uniform", 1.0)
    with pytest.raises(ValueError):
        ClosedLoop(0)
    with pytest.raises(ValueError):
        take(Poisson(0.0), 1)
