"""The `tracing:` and `access_log:` sections of the configuration (both off by default)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.strict_model import StrictModel

DEFAULT_OTLP_HTTP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
DEFAULT_OTLP_GRPC_ENDPOINT = "http://127.0.0.1:4317"


class TracingSettings(StrictModel):
    """OpenTelemetry tracing (`gateway.observability.tracer`). One SERVER span per request, children for
    admission, routing, each upstream attempt (CLIENT, its context sent upstream as `traceparent`) and
    the relay; never prompt or completion text, never keys."""

    enabled: bool = False
    exporter: Literal["otlp-http", "otlp-grpc", "none"] = "otlp-http"
    """`otlp-grpc` needs the `opentelemetry-exporter-otlp-proto-grpc` package (not installed by default);
    `none` builds the spans and drops them (for measuring the cost of tracing alone)."""
    endpoint: str | None = None
    """The collector: default `http://127.0.0.1:4318/v1/traces` (otlp-http, the full URL) or
    `http://127.0.0.1:4317` (otlp-grpc)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every export (e.g. a collector's auth header)."""
    sampling_ratio: float = Field(1.0, ge=0, le=1, allow_inf_nan=False)
    """Head sampling, parent-based: a request whose client sent a `traceparent` follows the client's
    sampled flag; one without is sampled with this probability (by trace id)."""
    service_name: str = Field("llm-gateway", min_length=1)
    export_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    max_queue_spans: int = Field(8192, ge=1)
    """Spans buffered for the background exporter; past it new spans are dropped (never blocks)."""


class AccessLogSettings(StrictModel):
    """One JSON line per request on the `llm_gateway.access` logger (`gateway.observability.access_log`):
    written off the event loop, to stdout by default. Error lines (any outcome but success) and slow
    requests are always kept; other lines are kept with probability `sample_ratio`."""

    enabled: bool = False
    sample_ratio: float = Field(1.0, ge=0, le=1, allow_inf_nan=False)
    slow_request_ms: float | None = Field(10_000.0, gt=0, allow_inf_nan=False)
    """A request that took at least this long (arrival to last byte) is always logged; null: never by
    duration."""
    slow_ttft_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    """A request whose TTFT is at least this is always logged; null (default): over its pool's
    `slo.ttft_s` when the pool has one."""
    stream: Literal["stdout", "stderr", "none"] = "stdout"
    """Where the logger's own handler writes; `none` adds no handler (the lines go to whatever handlers
    the process configured on `llm_gateway.access` or its parents)."""
