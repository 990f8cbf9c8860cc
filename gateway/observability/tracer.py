"""The OpenTelemetry tracer of one gateway instance, built from `tracing:` and flushed at close.

`build_tracer(settings, exporter=None)`:
- a `TracerProvider` of its own (never the process-global one: two apps in one process, as in the tests,
  keep their spans apart), resource `service.name = settings.service_name`;
- sampler `ParentBased(TraceIdRatioBased(sampling_ratio))`: head sampling; a client's `traceparent`
  decides for its request, a request without one is sampled with the ratio;
- exporter: OTLP over HTTP (protobuf) or gRPC to `endpoint`, or none; behind a `BatchSpanProcessor`
  (a background thread; the event loop only enqueues, and a full queue drops spans, never blocks).
  `exporter=` replaces the configured one and is flushed synchronously on each span end (tests pass the
  SDK's `InMemorySpanExporter`).

`GatewayTracer.shutdown()` flushes what is queued (up to the export timeout) and stops the exporter;
a collector that cannot be reached loses the spans, the gateway goes on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Tracer

from gateway.config.observability_settings import (
    DEFAULT_OTLP_GRPC_ENDPOINT,
    DEFAULT_OTLP_HTTP_ENDPOINT,
    TracingSettings,
)

if TYPE_CHECKING:
    from collections.abc import Callable

INSTRUMENTATION_NAME = "llm_gateway"


class TracingUnavailable(RuntimeError):
    """The configured exporter's package is not installed (the message says which)."""


class GatewayTracer:
    """The tracer and the provider that owns its span pipeline."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self.tracer: Tracer = provider.get_tracer(INSTRUMENTATION_NAME)

    async def shutdown(self) -> None:
        """Flush and stop the exporter, in a worker thread (an export may wait on the network)."""
        await asyncio.to_thread(self._provider.shutdown)


def build_tracer(settings: TracingSettings, exporter: SpanExporter | None = None) -> GatewayTracer:
    """The tracer for `settings` (module docstring); raises `TracingUnavailable` for a missing exporter."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return GatewayTracer(provider)
    configured = _configured_exporter(settings)
    if configured is not None:
        provider.add_span_processor(
            BatchSpanProcessor(
                configured,
                max_queue_size=settings.max_queue_spans,
                export_timeout_millis=int(settings.export_timeout_s * 1000),
            )
        )
    return GatewayTracer(provider)


def _configured_exporter(settings: TracingSettings) -> SpanExporter | None:
    if settings.exporter == "none":
        return None
    headers = dict(settings.headers) or None
    if settings.exporter == "otlp-http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(
            endpoint=settings.endpoint or DEFAULT_OTLP_HTTP_ENDPOINT,
            headers=headers,
            timeout=settings.export_timeout_s,
        )
    grpc_exporter = _grpc_exporter_class()
    return grpc_exporter(
        endpoint=settings.endpoint or DEFAULT_OTLP_GRPC_ENDPOINT,
        headers=headers,
        timeout=settings.export_timeout_s,
    )


def _grpc_exporter_class() -> Callable[..., SpanExporter]:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TracingUnavailable(
            "tracing.exporter: otlp-grpc needs the opentelemetry-exporter-otlp-proto-grpc package "
            "(pip install opentelemetry-exporter-otlp-proto-grpc), or use otlp-http"
        ) from None
    return OTLPSpanExporter  # type: ignore[no-any-return]
