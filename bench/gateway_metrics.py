"""The gateway's failure-containment figures over the measured window, from its /metrics.

Counters (`COUNTERS`) are read at the start of the measured window and at its end; the report shows the
difference, per label set (`cause/kind` for failures, `outcome` for quarantine, `reason` for retries and
rejections). The breakers are a gauge (`llm_gateway_breaker_state`: 0 closed, 1 half-open, 2 open), so
with `poll` the sampler reads it every interval and counts the transitions into *open* per replica
(CLOSED → OPEN and a failed half-open probe, HALF_OPEN → OPEN, alike); an opening that closes again
between two reads is missed, so the count is a lower bound at the sampling interval (an open breaker
stays open for `breaker.open_s`, 5 s by default, far longer than the 0.5 s interval).

Several gateway instances: each instance's /metrics is read and the counters are summed over instances
(`sum_counters`); each instance's breakers are its own, so with more than one instance a breaker is keyed
`replica@j` (instance j) and its openings are counted per instance. `llm_gateway_requests_total` (every
outcome) is read per instance (`parse_requests`), to show how the load spread over the instances.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.upstream.engine_metrics import ExpositionError, parse_exposition

PREFIX = "llm_gateway_"
COUNTERS: dict[str, tuple[str, ...]] = {
    "llm_gateway_upstream_failures_total": ("cause", "kind"),
    "llm_gateway_ejections_refused_total": (),
    "llm_gateway_stream_continuations_total": (),
    "llm_gateway_quarantine_total": ("outcome",),
    "llm_gateway_retries_total": ("reason",),
    "llm_gateway_panic_decisions_total": (),
    "llm_gateway_rejections_total": ("reason",),
}
BREAKER_STATE = "llm_gateway_breaker_state"
REQUESTS = "llm_gateway_requests_total"
OPEN = 2.0

Counters = dict[str, dict[str, float]]
"""Short metric name (no prefix, no `_total`) → label values joined by "/" ("" without labels) → value."""


def short_name(metric: str) -> str:
    return metric.removeprefix(PREFIX).removesuffix("_total")


def parse_counters(text: str) -> Counters:
    """The containment counters, summed over the label sets that differ only in labels not kept (model)."""
    try:
        samples = parse_exposition(text, tuple(COUNTERS))
    except ExpositionError:
        return {}
    counters: Counters = {}
    for metric, labels in COUNTERS.items():
        values = counters.setdefault(short_name(metric), {})
        for sample in samples.get(metric, ()):
            key = "/".join(sample.labels.get(name, "") for name in labels)
            values[key] = values.get(key, 0.0) + sample.value
    return counters


def sum_counters(per_instance: list[Counters]) -> Counters:
    """The counters of several gateway instances added up, per metric and label set."""
    out: Counters = {}
    for counters in per_instance:
        for name, values in counters.items():
            into = out.setdefault(name, {})
            for key, value in values.items():
                into[key] = into.get(key, 0.0) + value
    return out


def parse_requests(text: str) -> float | None:
    """`llm_gateway_requests_total` summed over models and outcomes; None when the text does not parse."""
    try:
        samples = parse_exposition(text, (REQUESTS,))
    except ExpositionError:
        return None
    return sum(sample.value for sample in samples.get(REQUESTS, ()))


def counter_deltas(start: Counters, end: Counters) -> dict[str, dict[str, int]]:
    """`end − start` per label set (a label set absent at the start counts from 0; never negative)."""
    out: dict[str, dict[str, int]] = {}
    for name, values in end.items():
        before = start.get(name, {})
        out[name] = {
            key: round(max(0.0, value - before.get(key, 0.0)))
            for key, value in sorted(values.items())
            if value - before.get(key, 0.0) > 0
        }
    return out


def total(deltas: Mapping[str, Mapping[str, int]], name: str, prefix: str = "") -> int:
    """The sum of one counter's deltas over the label sets starting with `prefix` (e.g. "replica/")."""
    return sum(v for k, v in deltas.get(name, {}).items() if k.startswith(prefix))


def parse_breakers(text: str, instance: int | None = None) -> dict[str, float]:
    """Replica id → breaker state (0 closed, 1 half-open, 2 open); with `instance` j the key is
    `replica@j` (one gateway instance among several)."""
    try:
        samples = parse_exposition(text, (BREAKER_STATE,))
    except ExpositionError:
        return {}
    suffix = "" if instance is None else f"@{instance}"
    return {s.labels.get("replica", "") + suffix: s.value for s in samples.get(BREAKER_STATE, ())}


@dataclass(slots=True)
class BreakerLog:
    """Breaker states read over time: (t_s from the run's start, replica → state)."""

    points: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def openings(self, from_s: float, to_s: float) -> dict[str, int]:
        """Transitions into OPEN seen at reads within [from_s, to_s], per replica (every replica read)."""
        previous: dict[str, float] = {}
        counts: dict[str, int] = {}
        for t_s, states in self.points:
            for replica, state in states.items():
                counts.setdefault(replica, 0)
                if from_s <= t_s <= to_s and state == OPEN and previous.get(replica, 0.0) != OPEN:
                    counts[replica] += 1
                previous[replica] = state
        return dict(sorted(counts.items()))

    def max_open_at_once(self, from_s: float, to_s: float) -> int:
        return max(
            (
                sum(1 for s in states.values() if s == OPEN)
                for t, states in self.points
                if from_s <= t <= to_s
            ),
            default=0,
        )


def summarize_gateway(
    start: Counters | None,
    end: Counters | None,
    breakers: BreakerLog | None,
    window_s: tuple[float, float],
    interval_s: float,
) -> dict[str, Any] | None:
    """The `gateway` entry of a run's summary: counter deltas and, when polled, breaker openings."""
    if start is None or end is None:
        return None
    summary: dict[str, Any] = {"counters": counter_deltas(start, end)}
    if breakers is not None and breakers.points:
        openings = breakers.openings(*window_s)
        summary["breakers"] = {
            "openings": openings,
            "opened_total": sum(openings.values()),
            "max_open_at_once": breakers.max_open_at_once(*window_s),
            "reads": len(breakers.points),
            "interval_s": interval_s,
        }
    return summary
