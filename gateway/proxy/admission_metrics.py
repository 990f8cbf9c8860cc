"""Admission's events as the gateway's metrics: the `AdmissionObserver` every pool's controller reports
to (queue depth, queue wait, refusals by reason, `prefix_wait` holds, the retry lane), one per model
name."""

from __future__ import annotations

from admission.outcomes import HoldOutcome, RejectReason
from gateway.base.metrics import GatewayMetrics
from gateway.observability.metric_children import Children


class MetricsObserver:
    """Admission events → Prometheus; each metric child resolved once per label values and kept
    (`gateway.observability.metric_children`), not per event."""

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self._model = model
        self._queue_depth = Children(metrics.queue_depth)
        self._queue_wait = Children(metrics.queue_wait_seconds)
        self._holds = Children(metrics.prefix_wait_total)
        self._held = Children(metrics.prefix_wait_seconds)
        self._retry_lane = Children(metrics.retry_lane_total)

    def queue_depth_changed(self, priority: str, depth: int) -> None:
        self._queue_depth(self._model, priority).set(depth)

    def dispatched(self, priority: str, queue_wait_s: float) -> None:
        self._queue_wait(priority).observe(queue_wait_s)

    def rejected(self, reason: RejectReason, priority: str) -> None:
        """Counted by the handler with every other rejection (`rejections_total`)."""

    def held(self, outcome: HoldOutcome, held_s: float) -> None:
        """A `prefix_wait` hold began or ended (`prefix_wait_total`; `prefix_wait_seconds` when ended)."""
        self._holds(self._model, outcome.value).inc()
        if outcome is not HoldOutcome.HELD:
            self._held(self._model, outcome.value).observe(held_s)

    def retry_lane(self, outcome: str, priority: str) -> None:
        """A retry promised, claimed, or refused without a promise (`retry_lane_total`)."""
        self._retry_lane(self._model, outcome).inc()
