"""The metrics of the replicas: the load the gateway puts on each, its learned latency model and cap, its
health, breaker and draining state, the pool's panic mode, what its engine reports (scraped), and the
models and LoRA adapters it serves (part of `GatewayMetrics`, on its registry).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.base.metric_naming import PREFIX, WORKERS_MAX, WORKERS_MIN, WORKERS_SUM


class ReplicaMetrics:
    """The replica family of `GatewayMetrics` (see the module docstring)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.inflight = Gauge(
            f"{PREFIX}_inflight",
            "Requests in flight per replica",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_SUM,
        )
        self.prefill_tokens_inflight = Gauge(
            f"{PREFIX}_prefill_tokens_inflight",
            "Uncached prompt tokens dispatched to the replica that have no first token yet",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_SUM,
        )
        self.latency_model_error_ratio = Gauge(
            f"{PREFIX}_latency_model_error_ratio",
            "Mean absolute percentage error of the replica's learned latency model (EW, target=ttft|tpot)",
            ["replica", "target"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.learned_max_concurrency = Gauge(
            f"{PREFIX}_learned_max_concurrency",
            "Largest batch the replica's TPOT model predicts within the pool's TPOT SLO (0: none)",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.learned_cap_set_point_seconds = Gauge(
            f"{PREFIX}_learned_cap_set_point_seconds",
            "Token latency the replica's learned cap steers its engine to: the trimmed set point, or "
            "the reachable one after cuts that did not lower it (0: no engine token latency)",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.learned_cap_held_at_floor = Gauge(
            f"{PREFIX}_learned_cap_held_at_floor",
            "1 while the replica's learned cap is within twice min_cap_per_replica and the engine's token "
            "latency is still over the set point: the TPOT objective out of reach at any batch it allows",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_up = Gauge(
            f"{PREFIX}_replica_up",
            "1 when the replica is eligible for traffic health-wise",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MIN,
        )
        self.replicas = Gauge(
            f"{PREFIX}_replicas",
            "Replicas per pool by state",
            ["pool", "state"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.breaker_state = Gauge(
            f"{PREFIX}_breaker_state",
            "Circuit breaker per replica: 0 closed, 1 half-open, 2 open",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
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
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_draining = Gauge(
            f"{PREFIX}_replica_draining",
            "1 while the replica is draining",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_engine_running = Gauge(
            f"{PREFIX}_replica_engine_running",
            "Requests the engine reports running",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_engine_waiting = Gauge(
            f"{PREFIX}_replica_engine_waiting",
            "Requests the engine reports waiting",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_kv_usage_ratio = Gauge(
            f"{PREFIX}_replica_kv_usage_ratio",
            "Engine KV-cache usage, 0..1",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_prefix_cache_hit_ratio = Gauge(
            f"{PREFIX}_replica_prefix_cache_hit_ratio",
            "Engine prefix-cache hit ratio over the last scrape interval",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.scrape_errors_total = Counter(
            f"{PREFIX}_scrape_errors_total",
            "Failed or stale engine /metrics scrapes, by reason",
            ["replica", "reason"],
            registry=r,
        )
        self.replica_lora_adapters = Gauge(
            f"{PREFIX}_replica_lora_adapters",
            "LoRA adapters the engine reports with running / waiting requests (vllm:lora_requests_info)",
            ["replica", "state"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
        )
        self.replica_models = Gauge(
            f"{PREFIX}_replica_models",
            "Client-facing model names the replica serves, from its /v1/models (models.discover)",
            ["replica"],
            registry=r,
            multiprocess_mode=WORKERS_MAX,
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
