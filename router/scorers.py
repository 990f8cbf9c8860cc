"""Load scorers. Each maps candidates to [0, 1], higher meaning "send here".

Every load scorer inverts a per-replica metric x_i (lower is better) with one of two normalisations over
the candidates, so weights in a profile stay comparable across scorers:
- `min-max` (default): score_i = (max - x_i) / (max - min), or 1.0 for all when every value is equal;
  the least loaded always scores 1 and the most loaded 0, however small the gap;
- `ratio`: score_i = 1 - x_i / max, or 1.0 for all when max ≤ 0; proportional to the gap, so a
  one-request difference between busy replicas barely moves the score (used beside a prefix scorer).

Metrics (the registered scorer types of `router.plugins`):
- `inflight`: the gateway's own in-flight load in `unit` (requests or estimated tokens);
- `queue`: in-flight requests + the engine's waiting queue when its sample is fresh (`router.load`);
- `kv-usage`: the engine's KV-cache usage ratio; a replica without a fresh sample counts as empty.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from router.load import LoadUnit, fresh_sample, inflight_load, request_load
from router.types import ReplicaView, RoutingRequest


class Normalisation(StrEnum):
    """How a load scorer maps metric values to [0, 1] (see the module docstring)."""

    MIN_MAX = "min-max"
    RATIO = "ratio"


def invert_min_max(values: list[float]) -> list[float]:
    """Lower value → higher score, scaled to [0, 1]; all-equal values all score 1.0."""
    low, high = min(values), max(values)
    if high <= low:
        return [1.0] * len(values)
    span = high - low
    return [(high - v) / span for v in values]


def invert_ratio(values: list[float]) -> list[float]:
    """Lower value → higher score: 1 - x / max; all 1.0 when the maximum is ≤ 0."""
    high = max(values)
    if high <= 0:
        return [1.0] * len(values)
    return [1.0 - v / high for v in values]


_NORMALISERS: dict[Normalisation, Callable[[list[float]], list[float]]] = {
    Normalisation.MIN_MAX: invert_min_max,
    Normalisation.RATIO: invert_ratio,
}


class InvertedMetricScorer:
    """Scores candidates by a per-replica metric where lower is better (min-max unless told).

    Its `name` is the metric's, suffixed `_ratio` under ratio normalisation (e.g. `queue_ratio`).
    `ratio_floor` (ratio only, default 0): score_i = 1 − x_i / max(max_j x_j, ratio_floor), so
    differences far below the floor barely move the score (prefill tokens below one engine chunk are
    all prefilled in the next step, whichever replica holds them).
    """

    def __init__(
        self,
        name: str,
        metric: Callable[[ReplicaView], float],
        normalise: Normalisation = Normalisation.MIN_MAX,
        ratio_floor: float = 0.0,
    ) -> None:
        self.name = name if normalise is Normalisation.MIN_MAX else f"{name}_ratio"
        self._metric = metric
        self._normalise = _NORMALISERS[normalise]
        self._floor = ratio_floor if normalise is Normalisation.RATIO else 0.0

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[float]:
        values = [self._metric(r) for r in replicas]
        if self._floor > 0 and values and max(values) < self._floor:
            return [1.0 - v / self._floor for v in values]
        return self._normalise(values)


def inflight_scorer(
    unit: LoadUnit = LoadUnit.REQUESTS, normalise: Normalisation = Normalisation.MIN_MAX
) -> InvertedMetricScorer:
    """Less gateway in-flight load in `unit` (requests or tokens) scores higher."""
    return InvertedMetricScorer(f"inflight_{unit}", lambda r: float(inflight_load(r, unit)), normalise)


def queue_scorer(normalise: Normalisation = Normalisation.MIN_MAX) -> InvertedMetricScorer:
    """Fewer in-flight plus engine-waiting requests scores higher."""
    return InvertedMetricScorer("queue", request_load, normalise)


def kv_usage(replica: ReplicaView) -> float:
    """The engine's KV-cache usage ratio; 0 without a fresh sample."""
    return fresh_sample(replica.engine).kv_usage_ratio


def kv_usage_scorer(normalise: Normalisation = Normalisation.MIN_MAX) -> InvertedMetricScorer:
    """Lower engine KV-cache usage scores higher; replicas without a fresh sample count as empty."""
    return InvertedMetricScorer("kv_usage", kv_usage, normalise)
