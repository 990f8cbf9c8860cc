"""Percentiles, latency distributions and SLO goodput — pure arithmetic, tested by hand-computed cases.

Percentiles interpolate linearly between the closest ranks (numpy's default, which the field's load tools
use): for sorted values v₀ … vₙ₋₁, the q-th percentile sits at rank r = q/100 · (n − 1) and equals
v⌊r⌋ + (v⌈r⌉ − v⌊r⌋) · (r − ⌊r⌋).

Goodput follows the field's definition (DistServe, vLLM's `--goodput`): a request counts when it
succeeded AND met both the TTFT SLO and the TPOT SLO; goodput is the number of such requests (and their
output tokens) per second of the measured window. A request with a single output token has no TPOT and
is judged on TTFT alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.sample import Sample


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]) of a non-empty sequence, linear interpolation."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of one latency series (same unit as the input)."""

    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        if not values:
            return None
        return cls(
            count=len(values),
            mean=sum(values) / len(values),
            p50=percentile(values, 50),
            p95=percentile(values, 95),
            p99=percentile(values, 99),
            min=min(values),
            max=max(values),
        )

    def scaled(self, factor: float) -> Distribution:
        """The same summary in another unit (e.g. ×1000 for seconds → milliseconds)."""
        return Distribution(
            self.count,
            self.mean * factor,
            self.p50 * factor,
            self.p95 * factor,
            self.p99 * factor,
            self.min * factor,
            self.max * factor,
        )


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency SLO of one request: time to first token and time per output token. `classes` gives a
    priority class objectives of its own, (name, ttft_s, tpot_s) each (`--class-slo`): the lowest class,
    whose queue wait the gateway's TTFT objective does not bound, is judged by what it was promised."""

    ttft_s: float
    tpot_s: float
    classes: tuple[tuple[str, float, float], ...] = ()

    def for_class(self, name: str | None) -> tuple[float, float]:
        """(ttft_s, tpot_s) a request of class `name` is judged by."""
        for cls, ttft_s, tpot_s in self.classes:
            if cls == name:
                return ttft_s, tpot_s
        return self.ttft_s, self.tpot_s

    def met_by(self, sample: Sample) -> bool:
        ttft_s, tpot_s = self.for_class(sample.priority)
        if not sample.ok or sample.ttft_s is None or sample.ttft_s > ttft_s:
            return False
        return sample.tpot_s is None or sample.tpot_s <= tpot_s

    def to_ms(self, suffix: str = "") -> dict[str, Any]:
        """The objectives in milliseconds as reports record them, keys `ttft<suffix>` and `tpot<suffix>`
        (the run's params: none; its summary: `_ms`), and `classes` with the same keys when set."""
        ttft, tpot = f"ttft{suffix}", f"tpot{suffix}"
        ms: dict[str, Any] = {ttft: self.ttft_s * 1000, tpot: self.tpot_s * 1000}
        if self.classes:
            ms["classes"] = {name: {ttft: t * 1000, tpot: p * 1000} for name, t, p in self.classes}
        return ms


@dataclass(frozen=True, slots=True)
class Goodput:
    requests: int
    output_tokens: int
    requests_per_s: float
    output_tokens_per_s: float
    attainment_ratio: float
    """Requests meeting the SLO ÷ requests sent (rejections and errors count as misses)."""


def goodput(samples: Iterable[Sample], slo: Slo, duration_s: float) -> Goodput:
    """Goodput of `samples` over a window of `duration_s` seconds (see the module docstring)."""
    sent = 0
    met = 0
    tokens = 0
    for sample in samples:
        sent += 1
        if slo.met_by(sample):
            met += 1
            tokens += sample.output_tokens
    return Goodput(
        requests=met,
        output_tokens=tokens,
        requests_per_s=met / duration_s if duration_s > 0 else 0.0,
        output_tokens_per_s=tokens / duration_s if duration_s > 0 else 0.0,
        attainment_ratio=met / sent if sent else 0.0,
    )


def max_mean_ratio(values: Iterable[float]) -> float | None:
    """max ÷ mean of per-replica loads (1.0 = perfectly balanced); None when there is no load."""
    items = list(values)
    if not items:
        return None
    mean = sum(items) / len(items)
    return max(items) / mean if mean > 0 else None


def tpot_s(e2e_s: float, ttft_s: float, output_tokens: int) -> float | None:
    """Time per output token after the first: (e2e − ttft) / (tokens − 1); None for < 2 tokens."""
    if output_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (output_tokens - 1)
