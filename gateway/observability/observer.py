"""The per-request record factory: what each request gets at arrival, by the `tracing:` and
`access_log:` settings.

    tracing off, access log off  → `NO_RECORD` (shared; every hook a no-op, no header is read)
    tracing off, access log on   → `LoggedRecord` (trace id: the client's `traceparent`, if any)
    tracing on                   → `TracedRecord`: a SERVER span started now, child of the client's
                                   `traceparent`/`tracestate` when sent (W3C trace context)

`RequestObserver.start()` starts the access log's writer; `aclose()` flushes the spans and the log.
"""

from __future__ import annotations

import random

from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.api.asgi_io import Scope
from gateway.config.observability_settings import AccessLogSettings, TracingSettings
from gateway.observability import genai
from gateway.observability.access_log import AccessLog
from gateway.observability.request_record import NO_RECORD, LoggedRecord, RequestRecord, client_trace_id
from gateway.observability.request_spans import TracedRecord
from gateway.observability.tracer import GatewayTracer, build_tracer

_TRACE_HEADERS = (b"traceparent", b"tracestate")
_PROPAGATOR = TraceContextTextMapPropagator()


def _trace_headers(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in scope["headers"]:
        if key in _TRACE_HEADERS:
            found[key.decode("latin-1")] = value.decode("latin-1")
    return found


class RequestObserver:
    """Makes each request's `RequestRecord` (module docstring); one per app, built by the composition root."""

    def __init__(
        self,
        tracing: TracingSettings,
        access_log: AccessLogSettings,
        rng: random.Random | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        self.tracer: GatewayTracer | None = None
        if tracing.enabled:
            self.tracer = build_tracer(tracing, span_exporter)
        self.access_log = AccessLog(access_log, rng or random.Random()) if access_log.enabled else None

    @property
    def makes_records(self) -> bool:
        """Whether requests get a record of their own (tracing or access log on); else every request's
        is the shared no-op `NO_RECORD`, and the record sink need not subscribe to the event port."""
        return self.tracer is not None or self.access_log is not None

    def start(self) -> None:
        if self.access_log is not None:
            self.access_log.start()

    async def aclose(self) -> None:
        """Flush and stop the span exporter and the access log's writer (idempotent)."""
        tracer, self.tracer = self.tracer, None
        if tracer is not None:
            await tracer.shutdown()
        if self.access_log is not None:
            await self.access_log.stop()

    def begin(self, scope: Scope, request_id: str, endpoint: str | None = None) -> RequestRecord:
        """The record of a request to `endpoint` (its path) that just arrived (a SERVER span starts now
        when tracing)."""
        tracer = self.tracer
        if tracer is None:
            if self.access_log is None:
                return NO_RECORD
            trace_id = client_trace_id(_trace_headers(scope).get("traceparent"))
            return LoggedRecord(self.access_log, request_id, trace_id, endpoint, scope.get("method"))
        parent = _PROPAGATOR.extract(_trace_headers(scope))
        path = scope.get("path", "")
        span = tracer.tracer.start_span(
            f"{scope.get('method', 'POST')} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                genai.HTTP_METHOD: scope.get("method", "POST"),
                genai.URL_PATH: path,
                genai.REQUEST_ID: request_id,
            },
        )
        return TracedRecord(tracer.tracer, span, self.access_log, request_id, endpoint, scope.get("method"))
