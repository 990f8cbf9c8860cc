"""Prometheus metrics under the `llm_gateway_` prefix (`gateway.base.metric_naming`), on a registry owned
by one app instance.

No module-level registry: `GatewayMetrics()` builds its own `CollectorRegistry`, so two apps in one
process (tests, the demo) never share counters. The metrics come in families, each defined in its own
module: what clients see (`request_metrics`), dispatch and failed tries (`dispatch_metrics`), the
replicas (`replica_metrics`); the instance's shared-state errors are defined here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway.base.dispatch_metrics import DispatchMetrics
from gateway.base.metric_naming import PREFIX
from gateway.base.replica_metrics import ReplicaMetrics
from gateway.base.request_metrics import RequestMetrics

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics(RequestMetrics, DispatchMetrics, ReplicaMetrics):
    """Every metric the gateway exports (DESIGN §4 "Metrics"): each family's, on one registry."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series: they double the exposition for no operator value
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        RequestMetrics.__init__(self, r)
        DispatchMetrics.__init__(self, r)
        ReplicaMetrics.__init__(self, r)
        self.state_errors_total = Counter(
            f"{PREFIX}_state_errors_total",
            "Shared-state (Redis) operations that failed and took the configured on_error path",
            ["operation"],
            registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
