"""The metrics of dispatch: how requests wait in admission (queue depth and wait, prefix waits), how
routing decides, and what happens around a failed try (fallback to another pool, retries, failures by
the cause they were charged to, stream continuations, poison quarantine). Part of `GatewayMetrics`, on
its registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.base.metric_naming import PREFIX, WORKERS_SUM

_DECIDE_BUCKETS_S = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class DispatchMetrics:
    """The dispatch family of `GatewayMetrics` (see the module docstring)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth",
            "Requests waiting for a replica slot",
            ["model", "priority"],
            registry=r,
            multiprocess_mode=WORKERS_SUM,
        )
        self.queue_wait_seconds = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time from arrival to dispatch, for dispatched requests",
            ["priority"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.prefix_wait_total, self.prefix_wait_seconds = _prefix_wait_metrics(r)
        self.retry_lane_total = Counter(
            f"{PREFIX}_retry_lane_total",
            "The retry lane (admission.retry_lane): queue refusals that booked their retry a place "
            "(promised) or got none (unpromised), retries that came back in time (claimed), and of "
            "those the ones refused all the same (broken)",
            ["model", "outcome"],
            registry=r,
        )
        self.routing_decisions_total = Counter(
            f"{PREFIX}_routing_decisions_total",
            "Routing decisions by policy and branch",
            ["policy", "branch"],
            registry=r,
        )
        self.routing_decision_seconds = Histogram(
            f"{PREFIX}_routing_decision_seconds",
            "Time spent in the routing policy per decision",
            buckets=_DECIDE_BUCKETS_S,
            registry=r,
        )
        self.panic_decisions_total = Counter(
            f"{PREFIX}_panic_decisions_total",
            "Routing decisions made in panic mode (over every up, non-draining replica)",
            ["model"],
            registry=r,
        )
        self.fallbacks_total = Counter(
            f"{PREFIX}_fallbacks_total",
            "Requests a pool refused and passed to its fallback pool, by refusal",
            ["model", "fallback", "reason"],
            registry=r,
        )
        self.retries_total = Counter(
            f"{PREFIX}_retries_total",
            "Upstream attempts retried before the first byte",
            ["reason"],
            registry=r,
        )
        self.upstream_failures_total = Counter(
            f"{PREFIX}_upstream_failures_total",
            "Failed upstream attempts by the cause they were charged to (replica, request, load) and kind",
            ["model", "cause", "kind"],
            registry=r,
        )
        self.stream_continuations_total = Counter(
            f"{PREFIX}_stream_continuations_total",
            "Broken streams continued on another replica after the first byte",
            ["model"],
            registry=r,
        )
        self.quarantine_total = Counter(
            f"{PREFIX}_quarantine_total",
            "Poison-request quarantine: requests quarantined after breaking two replicas, and arrivals "
            "refused because their fingerprint is quarantined",
            ["model", "outcome"],
            registry=r,
        )


def _prefix_wait_metrics(r: CollectorRegistry) -> tuple[Counter, Histogram]:
    """`prefix_wait_total{model,outcome}` and `prefix_wait_seconds{model,outcome}` (pools[].prefix_wait;
    outcomes: `admission.outcomes.HoldOutcome`)."""
    total = Counter(
        f"{PREFIX}_prefix_wait_total",
        "Queued requests that waited for the replica holding their prefix (pools[].prefix_wait): "
        "held when one starts waiting, then once how it left the queue - owner (served by that "
        "replica), spilled (another), refused, cancelled",
        ["model", "outcome"],
        registry=r,
    )
    seconds = Histogram(
        f"{PREFIX}_prefix_wait_seconds",
        "Time from a queued request's first wait for its prefix's replica to its leaving the queue",
        ["model", "outcome"],
        buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60),
        registry=r,
    )
    return total, seconds
