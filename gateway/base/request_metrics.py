"""The metrics of what clients see: requests by outcome, their latency (end to end, TTFT, TPOT), tokens,
goodput against the pool's SLO, each tenant's use, contract errors and how long they took, and client
connections (part of `GatewayMetrics`, on its registry).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.base.metric_naming import PREFIX, WORKERS_SUM

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 20, 40, 80, 160, 320)
_TPOT_BUCKETS_S = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
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


class RequestMetrics:
    """The request family of `GatewayMetrics` (see the module docstring)."""

    def __init__(self, r: CollectorRegistry) -> None:
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
        self.tokens_total = Counter(
            f"{PREFIX}_tokens_total", "Tokens from upstream usage, by direction", ["direction"], registry=r
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
        self.client_timeouts_total = Counter(
            f"{PREFIX}_client_timeouts_total",
            "Client connections ended by a client-side deadline: idle (nothing sent), header, body, write, "
            "slow_read (a reader under server.min_read_bytes_per_s)",
            ["phase"],
            registry=r,
        )
        self.client_connections = Gauge(
            f"{PREFIX}_client_connections",
            "Open client connections (HTTP/1.1)",
            registry=r,
            multiprocess_mode=WORKERS_SUM,
        )
        self.client_connections_refused_total = Counter(
            f"{PREFIX}_client_connections_refused_total",
            "Client connections over server.max_connections: answered 503 connection_limit (request) "
            "or closed when accepted (accept)",
            ["stage"],
            registry=r,
        )
