"""Helpers of the tracing and access-log tests: an engine that records the headers it receives (and can
fail every request with a status), a traced gateway with the SDK's in-memory span exporter, and a
capture of the access logger's lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.config.settings import parse_settings
from gateway.observability.access_log import ACCESS_LOGGER
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread

MODEL = "test-model"
PROMPT = "zebra-quasar-xkcdq describe the violet lighthouse"
"""A distinctive prompt: no span attribute, event or log line may contain any of its words."""
PROMPT_WORDS = ("zebra", "quasar", "xkcdq", "violet", "lighthouse")  # no digits: a port could hold them


class RecordingEngine:
    """ASGI wrapper of a mock engine: records each POST's headers; with `fail_status`, answers every POST
    with that status instead of the engine's answer."""

    def __init__(self, fail_status: int | None = None) -> None:
        core = FixedDelayCore(0.005, 0.001)
        self.inner = MockEngineApp(
            MockEngineConfig(model=MODEL, default_max_tokens=16), core, FaultSettings()
        )
        self.fail_status = fail_status
        self.posts: list[dict[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.posts.append({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]})
            if self.fail_status is not None:
                message = await receive()
                while message.get("more_body"):
                    message = await receive()
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": self.fail_status, "headers": headers})
                body = b'{"error": {"message": "injected", "type": "server_error"}}'
                await send({"type": "http.response.body", "body": body})
                return
        await self.inner(scope, receive, send)


def start_engine(fail_status: int | None = None) -> ServerThread:
    return ServerThread(RecordingEngine(fail_status), "recording-engine").start()


def engine_posts(engine: ServerThread) -> list[dict[str, str]]:
    app: RecordingEngine = engine.app
    return app.posts


def start_traced_gateway(raw: dict[str, Any], exporter: InMemorySpanExporter) -> ServerThread:
    return ServerThread(create_app(parse_settings(raw), span_exporter=exporter), "gateway").start()


def spans_of(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [
        s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id
    ]


def server_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind.name == "SERVER"]


def every_recorded_text(spans: list[ReadableSpan]) -> str:
    """Names, attribute keys and values, event names and their attributes, status descriptions."""
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v!r}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v!r}" for k, v in (event.attributes or {}).items())
        parts.append(span.status.description or "")
        parts.extend(f"{k}={v!r}" for k, v in span.resource.attributes.items())
    return "\n".join(parts)


class AccessLines(logging.Handler):
    """Collects the access logger's lines (the gateway runs in a thread of this process)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def parsed(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


def capture_access_log() -> Iterator[AccessLines]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handler = AccessLines()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
