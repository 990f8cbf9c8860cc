"""Prometheus metrics under the `llm_gateway_` prefix, on a registry owned by one app instance.

No module-level registry: `GatewayMetrics()` builds its own `CollectorRegistry`, so two apps in one
process (tests, the demo) never share counters. Labels never carry request ids, prompts or session keys.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "llm_gateway"

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 40, 80, 160, 320)
_TPOT_BUCKETS_S = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
_DECIDE_BUCKETS_S = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)
# Refusals at arrival take about a millisecond, queue timeouts a class's max wait (seconds to minutes).
_REJECTION_BUCKETS_S = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
)

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class GatewayMetrics:
    """Every metric the gateway exports (DESIGN §4 "Metrics")."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series: they double the exposition for no operator value
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests_total = Counter(
            f"{PREFIX}_requests_total", "Requests by model and outcome", ["model", "outcome"], registry=r
        )
        self.request_duration_seconds = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "End-to-end request duration as seen by the gateway",
            ["model"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.ttft_seconds = Histogram(
            f"{PREFIX}_ttft_seconds",
            "Time to the first content token (streaming) or the full response (non-streaming)",
            ["model"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tpot_seconds = Histogram(
            f"{PREFIX}_tpot_seconds",
            "Time per output token after the first: (e2e - ttft) / (completion_tokens - 1)",
            ["model"],
            buckets=_TPOT_BUCKETS_S,
            registry=r,
        )
        self.inflight = Gauge(f"{PREFIX}_inflight", "Requests in flight per replica", ["replica"], registry=r)
        self.prefill_tokens_inflight = Gauge(
            f"{PREFIX}_prefill_tokens_inflight",
            "Uncached prompt tokens dispatched to the replica that have no first token yet",
            ["replica"],
            registry=r,
        )
        self.latency_model_error_ratio = Gauge(
            f"{PREFIX}_latency_model_error_ratio",
            "Mean absolute percentage error of the replica's learned latency model (EW, target=ttft|tpot)",
            ["replica", "target"],
            registry=r,
        )
        self.learned_max_concurrency = Gauge(
            f"{PREFIX}_learned_max_concurrency",
            "Largest batch the replica's TPOT model predicts within the pool's TPOT SLO (0: none)",
            ["replica"],
            registry=r,
        )
        self.replica_up = Gauge(
            f"{PREFIX}_replica_up",
            "1 when the replica is eligible for traffic health-wise",
            ["replica"],
            registry=r,
        )
        self.replicas = Gauge(
            f"{PREFIX}_replicas", "Replicas per pool by state", ["pool", "state"], registry=r
        )
        self.breaker_state = Gauge(
            f"{PREFIX}_breaker_state",
            "Circuit breaker per replica: 0 closed, 1 half-open, 2 open",
            ["replica"],
            registry=r,
        )
        self.replica_draining = Gauge(
            f"{PREFIX}_replica_draining", "1 while the replica is draining", ["replica"], registry=r
        )
        self.replica_engine_running = Gauge(
            f"{PREFIX}_replica_engine_running", "Requests the engine reports running", ["replica"], registry=r
        )
        self.replica_engine_waiting = Gauge(
            f"{PREFIX}_replica_engine_waiting", "Requests the engine reports waiting", ["replica"], registry=r
        )
        self.replica_kv_usage_ratio = Gauge(
            f"{PREFIX}_replica_kv_usage_ratio", "Engine KV-cache usage, 0..1", ["replica"], registry=r
        )
        self.replica_prefix_cache_hit_ratio = Gauge(
            f"{PREFIX}_replica_prefix_cache_hit_ratio",
            "Engine prefix-cache hit ratio over the last scrape interval",
            ["replica"],
            registry=r,
        )
        self.replica_lora_adapters = Gauge(
            f"{PREFIX}_replica_lora_adapters",
            "LoRA adapters the engine reports with running / waiting requests (vllm:lora_requests_info)",
            ["replica", "state"],
            registry=r,
        )
        self.replica_models = Gauge(
            f"{PREFIX}_replica_models",
            "Client-facing model names the replica serves, from its /v1/models (models.discover)",
            ["replica"],
            registry=r,
        )
        self.model_discovery_errors_total = Counter(
            f"{PREFIX}_model_discovery_errors_total",
            'Failed reads of a replica\'s /v1/models (last list kept); replica="loop": the loop failed',
            ["replica"],
            registry=r,
        )
        self.adapter_loads_total = Counter(
            f"{PREFIX}_adapter_loads_total",
            "LoRA adapters the gateway loaded onto a replica at run time, by outcome (loaded, failed, full)",
            ["model", "outcome"],
            registry=r,
        )
        self.fallbacks_total = Counter(
            f"{PREFIX}_fallbacks_total",
            "Requests a pool refused and passed to its fallback pool, by refusal",
            ["model", "fallback", "reason"],
            registry=r,
        )
        self.scrape_errors_total = Counter(
            f"{PREFIX}_scrape_errors_total",
            "Failed or stale engine /metrics scrapes, by reason",
            ["replica", "reason"],
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
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth", "Requests waiting for a replica slot", ["model", "priority"], registry=r
        )
        self.queue_wait_seconds = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time from arrival to dispatch, for dispatched requests",
            ["priority"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.prefix_wait_total, self.prefix_wait_seconds = _prefix_wait_metrics(r)
        self.tenant_requests_total = Counter(
            f"{PREFIX}_tenant_requests_total",
            "Requests by tenant and outcome",
            ["tenant", "outcome"],
            registry=r,
        )
        self.tenant_tokens_total = Counter(
            f"{PREFIX}_tenant_tokens_total",
            "Tokens used by tenant (from usage)",
            ["tenant", "direction"],
            registry=r,
        )
        self.state_errors_total = Counter(
            f"{PREFIX}_state_errors_total",
            "Shared-state (Redis) operations that failed and took the configured on_error path",
            ["operation"],
            registry=r,
        )
        self.retries_total = Counter(
            f"{PREFIX}_retries_total",
            "Upstream attempts retried before the first byte",
            ["reason"],
            registry=r,
        )
        self.rejections_total = Counter(
            f"{PREFIX}_rejections_total",
            "Requests answered with a contract error, by reason",
            ["reason"],
            registry=r,
        )
        self.rejection_duration_seconds = Histogram(
            f"{PREFIX}_rejection_duration_seconds",
            "Time from the request reaching the gateway's handler to its error response being written, "
            "by reason (errors before the first byte; a stream's terminal error event is not counted)",
            ["reason"],
            buckets=_REJECTION_BUCKETS_S,
            registry=r,
        )
        self.goodput_requests_total = Counter(
            f"{PREFIX}_goodput_requests_total",
            "Successful requests that met the pool's SLO (TTFT and TPOT)",
            ["model"],
            registry=r,
        )
        self.slo_requests_total = Counter(
            f"{PREFIX}_slo_requests_total",
            "Successful requests the goodput test ran on (those with a completion token count)",
            ["model"],
            registry=r,
        )
        self.goodput_tokens_total = Counter(
            f"{PREFIX}_goodput_tokens_total",
            "Output tokens of requests that met the pool's SLO (TTFT and TPOT)",
            ["model"],
            registry=r,
        )
        self.upstream_failures_total = Counter(
            f"{PREFIX}_upstream_failures_total",
            "Failed upstream attempts by the cause they were charged to (replica, request, load) and kind",
            ["model", "cause", "kind"],
            registry=r,
        )
        self.breaker_transitions_total = Counter(
            f"{PREFIX}_breaker_transitions_total",
            "Circuit-breaker transitions by the state entered: open (a trip, or a failed half-open probe) "
            "and closed (a successful probe); the half-open state is entered by time and not counted",
            ["replica", "to"],
            registry=r,
        )
        self.ejections_refused_total = Counter(
            f"{PREFIX}_ejections_refused_total",
            "Breakers kept closed because the pool's ejection budget (breaker.max_ejected_ratio) was spent",
            ["model"],
            registry=r,
        )
        self.pool_panic = Gauge(
            f"{PREFIX}_pool_panic",
            "1 while the pool routes in panic mode (too few routable replicas: breakers ignored)",
            ["model"],
            registry=r,
        )
        self.panic_decisions_total = Counter(
            f"{PREFIX}_panic_decisions_total",
            "Routing decisions made in panic mode (over every up, non-draining replica)",
            ["model"],
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
        self.tokens_total = Counter(
            f"{PREFIX}_tokens_total", "Tokens from upstream usage, by direction", ["direction"], registry=r
        )
        self.client_timeouts_total = Counter(
            f"{PREFIX}_client_timeouts_total",
            "Client connections ended by a client-side deadline: idle (nothing sent), header, body, write, "
            "slow_read (a reader under server.min_read_bytes_per_s)",
            ["phase"],
            registry=r,
        )
        self.client_connections = Gauge(
            f"{PREFIX}_client_connections", "Open client connections (HTTP/1.1)", registry=r
        )
        self.client_connections_refused_total = Counter(
            f"{PREFIX}_client_connections_refused_total",
            "Client connections over server.max_connections: answered 503 connection_limit (request) "
            "or closed when accepted (accept)",
            ["stage"],
            registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)


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
