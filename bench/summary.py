"""From samples to a run summary (a JSON-ready dict): latency percentiles, throughput, goodput, outcomes
by reason, SLO attainment per priority class, requests per replica.

The measured window runs from the first measured send to the last measured answer; throughput and
goodput are counts over that window. Latency percentiles cover successful requests; rejection latency
covers the rejected ones. Requests per replica come from `x-gateway-replica`; the engines' own load
(running + waiting, sampled) is added by `EngineSampler.summary` under `engine`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.engine_metrics import LoadSeries
from bench.sample import Sample
from bench.stats import Distribution, Slo, goodput, max_mean_ratio, percentile

MS = 1000.0
LAG_WARNING_MS = 25.0
DEFAULT_CLASS = "default"


@dataclass(slots=True)
class RunResult:
    """One run of one target at one load level, as the report sees it."""

    label: str
    level: float | None
    level_kind: str
    samples: list[Sample]
    summary: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    series: LoadSeries | None = None
    time_scale: float = 1.0

    @property
    def measured(self) -> list[Sample]:
        """Measured samples (no warm-up), in reported units (simulated seconds when scaled)."""
        return [scale_sample(s, self.time_scale) for s in self.samples if not s.warmup]


def scale_sample(sample: Sample, k: float) -> Sample:
    """Wall-clock seconds → simulated seconds (× k) for every latency and offset of a sample."""
    if k == 1.0:
        return sample

    def times_k(v: float | None) -> float | None:
        return None if v is None else v * k

    return replace(
        sample,
        scheduled_s=sample.scheduled_s * k,
        sent_s=sample.sent_s * k,
        e2e_s=sample.e2e_s * k,
        ttft_s=times_k(sample.ttft_s),
        tpot_s=times_k(sample.tpot_s),
        max_gap_s=times_k(sample.max_gap_s),
    )


def window_s(samples: Sequence[Sample]) -> tuple[float, float]:
    if not samples:
        return (0.0, 0.0)
    return (min(s.sent_s for s in samples), max(s.done_s for s in samples))


def _dist_ms(values: Sequence[float]) -> dict[str, float] | None:
    dist = Distribution.of(values)
    return asdict(dist.scaled(MS)) if dist is not None else None


def outcomes(samples: Sequence[Sample]) -> dict[str, dict[str, Any]]:
    """Every non-ok outcome by reason: count, latency, share with a Retry-After and its mean."""
    by_reason: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        if not sample.ok:
            by_reason[sample.outcome].append(sample)
    result = {}
    for reason, group in sorted(by_reason.items()):
        with_header = [s.retry_after_s for s in group if s.retry_after_s is not None]
        result[reason] = {
            "count": len(group),
            "status": sorted({s.status for s in group}),
            "latency_ms": _dist_ms([s.e2e_s for s in group]),
            "retry_after_present_ratio": len(with_header) / len(group),
            "retry_after_mean_s": sum(with_header) / len(with_header) if with_header else None,
            "retried": sum(1 for s in group if s.attempts > 1),
        }
    return result


def retries(samples: Sequence[Sample]) -> dict[str, int]:
    """Requests refused and sent again after their Retry-After (`--honour-retry-after`): how many, and
    how many of them the last try got admitted (answered, not refused)."""
    retried = [s for s in samples if s.attempts > 1]
    return {"retried": len(retried), "admitted": sum(1 for s in retried if not s.rejected)}


def per_class(samples: Sequence[Sample], slo: Slo) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        groups[sample.priority or DEFAULT_CLASS].append(sample)
    result = {}
    for name, group in sorted(groups.items()):
        met = sum(1 for s in group if slo.met_by(s))
        result[name] = {
            "requests": len(group),
            "ok": sum(1 for s in group if s.ok),
            "rejected": sum(1 for s in group if s.rejected),
            "slo_met": met,
            "attainment_ratio": met / len(group),
            "ttft_ms": _dist_ms([s.ttft_s for s in group if s.ok and s.ttft_s is not None]),
        }
    return result


def summarize(
    raw: Sequence[Sample], slo: Slo, replica_ids: Sequence[str] = (), time_scale: float = 1.0
) -> dict[str, Any]:
    """The summary of the measured samples (warm-up already excluded by the caller).

    `replica_ids` lists the fleet's replicas so that one that received nothing counts as 0 in max/mean.
    With `time_scale` k ≠ 1 latencies, window and rates are in simulated units (wall × k); the outcome
    (rejection) latencies stay in wall-clock milliseconds, being the gateway's own.
    """
    samples = [scale_sample(s, time_scale) for s in raw]
    start_s, end_s = window_s(samples)
    duration_s = end_s - start_s
    ok = [s for s in samples if s.ok]
    tokens = sum(s.output_tokens for s in ok)
    replicas = Counter(s.replica for s in ok if s.replica)
    for replica in replica_ids:
        replicas.setdefault(replica, 0)
    good = goodput(samples, slo, duration_s)
    gaps = [s.max_gap_s for s in ok if s.max_gap_s is not None]
    return {
        "requests": len(samples),
        "ok": len(ok),
        "rejected": sum(1 for s in samples if s.rejected),
        "errors": sum(1 for s in samples if not s.ok and not s.rejected),
        "window_s": [start_s, end_s],
        "duration_s": duration_s,
        "ttft_ms": _dist_ms([s.ttft_s for s in ok if s.ttft_s is not None]),
        "tpot_ms": _dist_ms([s.tpot_s for s in ok if s.tpot_s is not None]),
        "e2e_ms": _dist_ms([s.e2e_s for s in ok]),
        "max_gap_ms": _dist_ms(gaps),
        "output_tokens": tokens,
        "throughput": {
            "requests_per_s": len(ok) / duration_s if duration_s > 0 else 0.0,
            "output_tokens_per_s": tokens / duration_s if duration_s > 0 else 0.0,
        },
        "slo": slo.to_ms("_ms"),
        "goodput": asdict(good),
        "outcomes": outcomes(raw),
        "retries": retries(raw),
        "per_class": per_class(samples, slo),
        "replicas": {
            "requests": dict(sorted(replicas.items())),
            "max_mean_ratio": max_mean_ratio(replicas.values()),
        },
        "client_lag_ms": _dist_ms([s.lag_s for s in samples]),
        "time_scale": time_scale,
        "wall_frames_per_s": _wall_rate(raw, sum(s.frames for s in raw)),
        "warnings": warnings(raw),
    }


def _wall_rate(raw: Sequence[Sample], count: float) -> float:
    start_s, end_s = window_s(raw)
    return count / (end_s - start_s) if end_s > start_s else 0.0


def warnings(raw: Sequence[Sample]) -> list[str]:
    """Signs that the figures do not measure what was asked (wall-clock samples)."""
    found = []
    lags = [s.lag_s for s in raw]
    if lags:
        p99_ms = percentile(lags, 99) * MS
        if p99_ms > LAG_WARNING_MS:
            found.append(
                f"requests were sent late (lag p99 {p99_ms:.0f} ms wall): the client or the machine is "
                "saturated, or sessions waited for their previous turn; the offered load was not fully "
                "applied — lower --speed or --rate, or pin the processes"
            )
    return found
