"""Prometheus metrics under the `llm_gateway_` prefix (`gateway.base.metric_naming`), on a registry owned
by one app instance.

No module-level registry: `GatewayMetrics()` builds its own `CollectorRegistry`, so two apps in one
process (tests, the demo) never share counters. The metrics come in families, each defined in its own
module: what clients see (`request_metrics`), dispatch and failed tries (`dispatch_metrics`), the
replicas (`replica_metrics`); the instance's shared-state errors are defined here.

Several workers (`server.workers` > 1, `gateway.ops.workers`): the supervisor sets
`PROMETHEUS_MULTIPROC_DIR` before the workers start, so the Prometheus client of every worker keeps each
value in a memory-mapped file of that directory (its multiprocess mode). `/metrics` of any worker then
renders `scrape_registry`: the directory's files merged (counters and histograms summed over every
worker that ever ran, dead ones included; gauges by the mode each family declares, the table in
`gateway.base.metric_naming`). In that mode exemplars are not kept, and a series a worker removes (a
replica gone from discovery) stays in the merged view until the supervisor exits. With one worker
nothing of this applies: `scrape_registry` is `registry`.

A worker's pid is fixed for its life (spawned, never forked), so `fix_worker_pid` (called by the worker's
entry point before any metric exists) gives the client's multiprocess values that pid once instead of
asking the OS on every write (the client's default checks `os.getpid()`, a system call, on every
update to detect a fork); what each write does otherwise is unchanged.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.base.dispatch_metrics import DispatchMetrics
from gateway.base.metric_naming import PREFIX
from gateway.base.replica_metrics import ReplicaMetrics
from gateway.base.request_metrics import RequestMetrics

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Set (by the workers' supervisor) before `prometheus_client` is imported: the client's multiprocess
mode, in which every value lives in a file of that directory."""


class GatewayMetrics(RequestMetrics, DispatchMetrics, ReplicaMetrics):
    """Every metric the gateway exports (DESIGN §4 "Metrics"): each family's, on one registry."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series: they double the exposition for no operator value
        self.registry = CollectorRegistry(auto_describe=True)
        """Where the metrics are defined (and what tests read: this process's values)."""
        self.scrape_registry = self.registry
        """What `/metrics` renders: `registry`, or with several workers every worker's values merged."""
        multiproc_dir = os.environ.get(MULTIPROC_DIR_ENV)
        if multiproc_dir:
            self.scrape_registry = CollectorRegistry()
            MultiProcessCollector(self.scrape_registry, path=multiproc_dir)  # type: ignore[no-untyped-call]
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
        """The Prometheus text exposition `/metrics` serves (`scrape_registry`)."""
        return generate_latest(self.scrape_registry)


def fix_worker_pid() -> None:
    """In the multiprocess mode (module docstring), make every metric value created from now on use this
    process's pid, read once, instead of `os.getpid()` on every write. Only for a process that never
    forks after this (a spawned worker), and before it creates any metric: values created earlier keep
    their own file handles, and two handles on one pid's file would overwrite each other. Without
    `PROMETHEUS_MULTIPROC_DIR` it does nothing."""
    if not os.environ.get(MULTIPROC_DIR_ENV):
        return
    pid = os.getpid()
    values.ValueClass = values.MultiProcessValue(lambda: pid)  # type: ignore[no-untyped-call]
