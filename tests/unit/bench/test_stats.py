"""Percentile, goodput and balance arithmetic against hand-computed cases."""

from __future__ import annotations

import pytest

from bench.sample import Sample
from bench.stats import Distribution, Slo, goodput, max_mean_ratio, percentile, tpot_s


def s(ttft: float | None, tpot: float | None, tokens: int = 10, ok: bool = True, status: int = 200) -> Sample:
    return Sample(0, 0.0, 0.0, status, ok, e2e_s=1.0, ttft_s=ttft, tpot_s=tpot, output_tokens=tokens)


def test_percentile_interpolates_linearly_between_ranks() -> None:
    values = [10.0, 20.0, 30.0, 40.0]  # ranks 0..3
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0  # rank 1.5
    assert percentile(values, 90) == pytest.approx(37.0)  # rank 2.7 → 30 + 0.7 × 10
    assert percentile(values, 99) == pytest.approx(39.7)  # rank 2.97


def test_percentile_of_one_value_and_unsorted_input() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_summary_and_scaling() -> None:
    dist = Distribution.of([0.001 * k for k in range(1, 101)])  # 1 … 100 ms
    assert dist is not None
    assert dist.count == 100
    assert dist.p50 == pytest.approx(0.0505)  # rank 49.5 → 50.5 ms
    assert dist.p99 == pytest.approx(0.09901)  # rank 98.01
    ms = dist.scaled(1000)
    assert ms.mean == pytest.approx(50.5) and ms.max == pytest.approx(100.0) and ms.min == pytest.approx(1.0)
    assert Distribution.of([]) is None


def test_tpot_is_decode_time_per_token_after_the_first() -> None:
    assert tpot_s(e2e_s=1.1, ttft_s=0.1, output_tokens=11) == pytest.approx(0.1)
    assert tpot_s(e2e_s=1.0, ttft_s=0.5, output_tokens=1) is None


def test_goodput_needs_both_slos() -> None:
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    samples = [
        s(0.2, 0.04, tokens=100),  # meets both
        s(0.5, 0.05, tokens=50),  # exactly at both limits: meets
        s(0.6, 0.01),  # TTFT too slow
        s(0.1, 0.06),  # TPOT too slow
        s(0.1, None, tokens=1),  # single token: TTFT alone decides
        s(None, None, tokens=0, ok=False, status=429),  # rejected
    ]
    result = goodput(samples, slo, duration_s=10.0)
    assert result.requests == 3
    assert result.output_tokens == 151
    assert result.requests_per_s == pytest.approx(0.3)
    assert result.output_tokens_per_s == pytest.approx(15.1)
    assert result.attainment_ratio == pytest.approx(0.5)


def test_goodput_of_nothing() -> None:
    result = goodput([], Slo(1.0, 1.0), duration_s=0.0)
    assert (result.requests, result.requests_per_s, result.attainment_ratio) == (0, 0.0, 0.0)


def test_max_mean_ratio() -> None:
    assert max_mean_ratio([10, 10, 10, 10]) == 1.0
    assert max_mean_ratio([30, 10, 10, 10]) == pytest.approx(2.0)  # mean 15
    assert max_mean_ratio([0, 0]) is None
    assert max_mean_ratio([]) is None
