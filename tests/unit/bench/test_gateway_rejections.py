"""The gateway-side rejection latency read from its histogram: parsing, window, quantiles, report."""

import math

import pytest

from bench.gateway_rejections import (
    parse_rejection_histograms,
    quantile_s,
    share_within,
    summarize_rejections,
    window,
)

NAME = "llm_gateway_rejection_duration_seconds_bucket"


def _exposition(reason: str, cumulative: dict[str, float]) -> str:
    lines = ["# TYPE llm_gateway_rejection_duration_seconds histogram"]
    lines += [f'{NAME}{{le="{le}",reason="{reason}"}} {count}' for le, count in cumulative.items()]
    lines.append(f'llm_gateway_rejection_duration_seconds_count{{reason="{reason}"}} 0')
    return "\n".join(lines) + "\n"


def test_parse_sorts_buckets_by_edge_and_ignores_other_metrics() -> None:
    text = _exposition("queue_full", {"+Inf": 4, "0.001": 1, "0.005": 3}) + "other_metric 1\n"
    assert parse_rejection_histograms(text) == {"queue_full": [(0.001, 1.0), (0.005, 3.0), (math.inf, 4.0)]}
    assert parse_rejection_histograms('llm_gateway_rejection_duration_seconds_bucket{le="x" 1') == {}


def test_window_subtracts_the_baseline_per_bucket() -> None:
    start = {"queue_full": [(0.001, 5.0), (math.inf, 6.0)]}
    end = {"queue_full": [(0.001, 7.0), (math.inf, 10.0)], "queue_timeout": [(1.0, 1.0), (math.inf, 2.0)]}
    assert window(start, end) == {
        "queue_full": [(0.001, 2.0), (math.inf, 4.0)],
        "queue_timeout": [(1.0, 1.0), (math.inf, 2.0)],
    }


def test_quantiles_interpolate_inside_the_bucket_like_histogram_quantile() -> None:
    buckets = [(0.001, 50.0), (0.002, 90.0), (0.005, 100.0), (math.inf, 100.0)]
    assert quantile_s(0.5, buckets) == pytest.approx(0.001)  # rank 50 is the first bucket's edge
    assert quantile_s(0.7, buckets) == pytest.approx(0.0015)  # rank 70: halfway through (1, 2] ms
    assert quantile_s(0.99, buckets) == pytest.approx(0.0047)  # rank 99 of (90, 100] over (2, 5] ms
    assert quantile_s(0.25, buckets) == pytest.approx(0.0005)  # first bucket: from 0
    assert quantile_s(1.0, [(0.001, 1.0), (math.inf, 2.0)]) == 0.001, "in +Inf: the last finite edge"
    assert quantile_s(0.5, [(math.inf, 0.0)]) is None


def test_share_within_five_ms_and_the_summary() -> None:
    end = {"queue_full": [(0.001, 60.0), (0.005, 99.0), (0.01, 100.0), (math.inf, 100.0)]}
    assert share_within(0.005, end["queue_full"]) == pytest.approx(0.99)
    summary = summarize_rejections({}, end)
    assert summary["queue_full"]["count"] == 100
    assert summary["queue_full"]["within_5ms_ratio"] == pytest.approx(0.99)
    assert summary["queue_full"]["p99_ms"] == pytest.approx(5.0)
    assert summarize_rejections(end, end) == {}, "nothing in the window: no entry"
