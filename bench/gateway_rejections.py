"""The gateway's own rejection latency over the measured window, from its /metrics.

The client measures a refusal from its send to the last byte of the 429, so on a small shared machine
its figure includes its own event loop and the kernel's scheduling of three busy processes. The gateway
measures the part it owns — from the request reaching its handler to the error response being written
(`llm_gateway_rejection_duration_seconds{reason}`, a histogram). The sampler scrapes it at the start of
the measured window (after warm-up) and at the end; the difference of the cumulative buckets is the
window's distribution, per reason.

Quantiles are read from the buckets as Prometheus' `histogram_quantile` does: linear interpolation inside
the bucket that holds the rank, 0 as the lower edge of the first bucket, and the upper edge of the last
finite bucket when the rank falls in `+Inf`. They are therefore bucket-resolution estimates; the share
of rejections within 5 ms is exact whenever 5 ms is a bucket edge (it is in the gateway's buckets).

Several gateway instances: each instance is scraped and the cumulative buckets are added up per reason
and edge (`sum_histograms`; every instance has the same edges) before the window is taken, so the
figures are those of all the instances' rejections together.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.upstream.engine_metrics import ExpositionError, parse_exposition

BUCKETS = "llm_gateway_rejection_duration_seconds_bucket"
FAST_LIMIT_S = 0.005

# reason → [(upper edge in seconds, cumulative count)], edges ascending, +Inf last
Histograms = dict[str, list[tuple[float, float]]]


def parse_rejection_histograms(text: str) -> Histograms:
    """Cumulative buckets per reason; an exposition that does not parse reads as no histogram."""
    try:
        samples = parse_exposition(text, (BUCKETS,))
    except ExpositionError:
        return {}
    histograms: Histograms = {}
    for sample in samples.get(BUCKETS, ()):
        reason, le = sample.labels.get("reason"), sample.labels.get("le")
        if reason is None or le is None:
            continue
        histograms.setdefault(reason, []).append((float(le), sample.value))
    return {reason: sorted(buckets) for reason, buckets in histograms.items()}


def sum_histograms(per_instance: list[Histograms]) -> Histograms:
    """Cumulative buckets of several instances added up per reason and upper edge."""
    totals: dict[str, dict[float, float]] = {}
    for histograms in per_instance:
        for reason, buckets in histograms.items():
            into = totals.setdefault(reason, {})
            for le, count in buckets:
                into[le] = into.get(le, 0.0) + count
    return {reason: sorted(buckets.items()) for reason, buckets in totals.items()}


def window(start: Histograms, end: Histograms) -> Histograms:
    """The buckets of `end` minus those of `start` (a reason absent at the start counts from 0)."""
    out: Histograms = {}
    for reason, buckets in end.items():
        before = dict(start.get(reason, []))
        out[reason] = [(le, max(0.0, count - before.get(le, 0.0))) for le, count in buckets]
    return out


def quantile_s(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile (0 < q ≤ 1) by linear interpolation inside the bucket holding the rank."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


def share_within(limit_s: float, buckets: list[tuple[float, float]]) -> float | None:
    """Fraction of observations ≤ `limit_s` (the largest bucket edge not above it)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    within = max((count for le, count in buckets if le <= limit_s), default=0.0)
    return within / buckets[-1][1]


def summarize_rejections(start: Histograms, end: Histograms) -> dict[str, dict[str, Any]]:
    """Per reason over the window: count, p50 and p99 in ms, and the share answered within 5 ms."""
    out: dict[str, dict[str, Any]] = {}
    for reason, buckets in sorted(window(start, end).items()):
        count = buckets[-1][1] if buckets else 0.0
        if count <= 0:
            continue
        p50, p99 = quantile_s(0.5, buckets), quantile_s(0.99, buckets)
        out[reason] = {
            "count": int(count),
            "p50_ms": None if p50 is None else p50 * 1000.0,
            "p99_ms": None if p99 is None else p99 * 1000.0,
            "within_5ms_ratio": share_within(FAST_LIMIT_S, buckets),
        }
    return out
