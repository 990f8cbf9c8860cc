"""Admission's events as the gateway's metrics: the `AdmissionObserver` every pool's controller reports
to (queue depth, queue wait, refusals by reason, `prefix_wait` holds), one per model name."""

from __future__ import annotations

from admission.outcomes import HoldOutcome, RejectReason
from gateway.base.metrics import GatewayMetrics


class MetricsObserver:
    """Admission events → Prometheus."""

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self._metrics = metrics
        self._model = model

    def queue_depth_changed(self, priority: str, depth: int) -> None:
        self._metrics.queue_depth.labels(self._model, priority).set(depth)

    def dispatched(self, priority: str, queue_wait_s: float) -> None:
        self._metrics.queue_wait_seconds.labels(priority).observe(queue_wait_s)

    def rejected(self, reason: RejectReason, priority: str) -> None:
        """Counted by the handler with every other rejection (`rejections_total`)."""

    def held(self, outcome: HoldOutcome, held_s: float) -> None:
        """A `prefix_wait` hold began or ended (`prefix_wait_total`; `prefix_wait_seconds` when ended)."""
        self._metrics.prefix_wait_total.labels(self._model, outcome.value).inc()
        if outcome is not HoldOutcome.HELD:
            self._metrics.prefix_wait_seconds.labels(self._model, outcome.value).observe(held_s)
