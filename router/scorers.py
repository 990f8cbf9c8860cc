"""Load scorers. Each maps candidates to [0, 1], higher meaning "send here".

Two normalisations over the candidates keep weights in a profile comparable across scorers:
- min-max (default): score_i = (max - x_i) / (max - min), or 1.0 for all when every value is equal;
  the least loaded always scores 1 and the most loaded 0, however small the gap;
- ratio: score_i = 1 - x_i / max, or 1.0 for all when max ≤ 0; proportional to the gap, so a
  one-request difference between busy replicas barely moves the score (used beside a prefix scorer).
"""

from __future__ import annotations

from collections.abc import Callable

from router.load import LoadUnit, inflight_load, request_load
from router.types import ReplicaView, RoutingRequest


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


class InvertedMetricScorer:
    """Scores candidates by a per-replica metric where lower is better (min-max unless told)."""

    def __init__(
        self,
        name: str,
        metric: Callable[[ReplicaView], float],
        normalise: Callable[[list[float]], list[float]] = invert_min_max,
    ) -> None:
        self.name = name
        self._metric = metric
        self._normalise = normalise

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[float]:
        return self._normalise([self._metric(r) for r in replicas])


def inflight_scorer() -> InvertedMetricScorer:
    """Fewer gateway in-flight requests scores higher."""
    return InvertedMetricScorer("inflight", lambda r: float(r.inflight_requests))


def load_scorer(unit: LoadUnit = LoadUnit.REQUESTS) -> InvertedMetricScorer:
    """Less gateway in-flight load in `unit` (requests or tokens) scores higher."""
    return InvertedMetricScorer(f"inflight_{unit}", lambda r: float(inflight_load(r, unit)))


def queue_ratio_scorer() -> InvertedMetricScorer:
    """In-flight plus engine-waiting requests, ratio-normalised (1 - x / max)."""
    return InvertedMetricScorer("queue_ratio", request_load, invert_ratio)


def queue_scorer() -> InvertedMetricScorer:
    """Fewer in-flight plus engine-waiting requests scores higher."""
    return InvertedMetricScorer("queue", request_load)


def kv_usage_scorer() -> InvertedMetricScorer:
    """Lower engine KV-cache usage scores higher; replicas without a fresh sample count as empty."""

    def kv(replica: ReplicaView) -> float:
        engine = replica.engine
        return 0.0 if engine is None or engine.stale else engine.kv_usage_ratio

    return InvertedMetricScorer("kv_usage", kv)
