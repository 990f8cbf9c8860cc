"""OpenTelemetry tracing end to end (issue 17): a traced gateway on 127.0.0.1 in front of engines that
record what they receive, spans collected by the SDK's in-memory exporter."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.integration.tracing_fixtures import (
    MODEL,
    PROMPT,
    PROMPT_WORDS,
    engine_posts,
    every_recorded_text,
    server_spans,
    spans_of,
    start_engine,
    start_traced_gateway,
)
from tests.servers import ServerThread, gateway_settings, wait_until

CHAT = "/v1/chat/completions"
CLIENT_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CLIENT_SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{CLIENT_TRACE_ID:032x}-{CLIENT_SPAN_ID:016x}-01"
API_KEY = "sk-tenant-secret-4242"


@pytest.fixture
def servers() -> Iterator[list[ServerThread]]:
    started: list[ServerThread] = []
    yield started
    for server in reversed(started):
        server.stop()


def _pool(engines: list[ServerThread], **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engine": "vllm",
        "replicas": {"static": [e.url for e in engines]},
        "policy": "round-robin",
        **extra,
    }


def _traced(
    servers: list[ServerThread], engines: list[ServerThread], **tracing: Any
) -> tuple[ServerThread, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    raw = gateway_settings([_pool(engines)], tracing={"enabled": True, "exporter": "none", **tracing})
    gateway = start_traced_gateway(raw, exporter)
    servers.append(gateway)
    return gateway, exporter


def _body(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "stream": stream,
    }


def _send(gateway: ServerThread, stream: bool, headers: dict[str, str] | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {API_KEY}", **(headers or {})}
    response = httpx.post(gateway.url + CHAT, json=_body(stream), headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response


def _one_server_span(exporter: InMemorySpanExporter, count: int = 1) -> ReadableSpan:
    assert wait_until(lambda: len(server_spans(exporter)) >= count)
    return server_spans(exporter)[count - 1]


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_span_tree_genai_attributes_and_propagation(servers: list[ServerThread], stream: bool) -> None:
    engine = start_engine()
    servers.append(engine)
    gateway, exporter = _traced(servers, [engine])
    answer = _send(gateway, stream, {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"})
    if stream:
        assert "[DONE]" in answer.text

    server = _one_server_span(exporter)
    assert server.context is not None
    # a child of the client's trace
    assert server.context.trace_id == CLIENT_TRACE_ID
    assert server.parent is not None and server.parent.span_id == CLIENT_SPAN_ID
    assert server.kind is SpanKind.SERVER and server.name == f"chat {MODEL}"
    attrs = server.attributes or {}
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.request.max_tokens"] == 8
    assert attrs["gen_ai.usage.input_tokens"] > 0
    assert attrs["gen_ai.usage.output_tokens"] == 8
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert attrs["http.response.status_code"] == 200
    assert attrs["llm_gateway.outcome"] == "success" and attrs["llm_gateway.retries"] == 0
    assert attrs["llm_gateway.request_id"] == answer.headers["x-request-id"]
    assert [e.name for e in server.events] == ["first_token"]

    spans = spans_of(exporter, CLIENT_TRACE_ID)
    children = _children(spans, server)
    by_name = {s.name: s for s in children}
    assert set(by_name) == {"gateway.admission", "gateway.route", f"chat {MODEL}"}
    admission = by_name["gateway.admission"]
    assert (admission.attributes or {})["llm_gateway.priority"] == "interactive"
    assert (admission.attributes or {})["llm_gateway.queue.depth_at_arrival"] == 0
    route = by_name["gateway.route"].attributes or {}
    assert route["llm_gateway.route.policy"] == "round-robin"
    assert route["llm_gateway.replica"] == answer.headers["x-gateway-replica"]
    attempt = by_name[f"chat {MODEL}"]
    assert attempt.kind is SpanKind.CLIENT
    attempt_attrs = attempt.attributes or {}
    assert attempt_attrs["llm_gateway.attempt.outcome"] == "ok"
    assert attempt_attrs["server.address"] == "127.0.0.1" and attempt_attrs["server.port"] == engine.port
    assert [s.name for s in _children(spans, attempt)] == ["gateway.relay"]

    # the engine received the attempt span's context (and the client's tracestate)
    assert attempt.context is not None
    received = engine_posts(engine)[-1]
    assert received["traceparent"] == f"00-{CLIENT_TRACE_ID:032x}-{attempt.context.span_id:016x}-01"
    assert received["tracestate"] == "vendor=abc"

    # no prompt or completion text, no key, in any span
    text = every_recorded_text(exporter.get_finished_spans())
    for word in (*PROMPT_WORDS, API_KEY):
        assert word not in text


def test_a_retry_makes_two_attempt_spans_the_first_failed(servers: list[ServerThread]) -> None:
    broken, healthy = start_engine(fail_status=500), start_engine()
    servers += [broken, healthy]
    gateway, exporter = _traced(servers, [broken, healthy])
    retried: ReadableSpan | None = None
    for n in range(1, 5):  # round-robin: one of the first two requests goes to the broken one first
        _send(gateway, stream=n % 2 == 0)
        span = _one_server_span(exporter, n)
        if (span.attributes or {})["llm_gateway.retries"] == 1:
            retried = span
            break
    assert retried is not None and retried.context is not None
    spans = spans_of(exporter, retried.context.trace_id)
    attempts = sorted(
        (s for s in _children(spans, retried) if s.kind is SpanKind.CLIENT),
        key=lambda s: (s.attributes or {})["llm_gateway.attempt"],
    )
    assert len(attempts) == 2
    first, second = (a.attributes or {} for a in attempts)
    assert first["server.port"] == broken.port
    assert first["llm_gateway.attempt.outcome"] == "failed" and first["error.type"] == "upstream_status"
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert second["server.port"] == healthy.port and second["llm_gateway.attempt.outcome"] == "ok"
    routes = [s for s in _children(spans, retried) if s.name == "gateway.route"]
    assert len(routes) == 2  # the retry is routed again
    # each try sent its own span's context
    sent = {
        p["traceparent"][:-3]: int(p["traceparent"][-2:], 16)
        for p in engine_posts(broken) + engine_posts(healthy)
    }
    for attempt in attempts:
        assert attempt.context is not None
        flags = sent[f"00-{attempt.context.trace_id:032x}-{attempt.context.span_id:016x}"]
        assert flags & 0x01  # sampled


def test_a_refusal_span_has_the_clients_429_and_is_not_a_server_error(servers: list[ServerThread]) -> None:
    """A tenant over its rate: the server span records 429 (inherited by `RateLimited` from
    `Overloaded`; once recorded as 500) and the outcome, with no ERROR status (a 4xx is the client's)."""
    engine = start_engine()
    servers.append(engine)
    exporter = InMemorySpanExporter()
    raw = gateway_settings([_pool([engine])], tracing={"enabled": True, "exporter": "none"})
    key_hash = hashlib.sha256(API_KEY.encode()).hexdigest()
    raw["tenants"] = [{"name": "team-a", "api_key_hashes": [key_hash], "requests_per_min": 1}]
    gateway = start_traced_gateway(raw, exporter)
    servers.append(gateway)
    _send(gateway, stream=False)
    refused = httpx.post(
        gateway.url + CHAT, json=_body(False), headers={"authorization": f"Bearer {API_KEY}"}, timeout=10
    )
    assert refused.status_code == 429
    span = _one_server_span(exporter, 2)
    attributes = span.attributes or {}
    assert attributes["http.response.status_code"] == 429
    assert attributes["error.type"] == "rate_limited"
    assert span.status.status_code is not StatusCode.ERROR


def test_exemplars_on_an_openmetrics_scrape_only(servers: list[ServerThread]) -> None:
    engine = start_engine()
    servers.append(engine)
    gateway, exporter = _traced(servers, [engine])
    _send(gateway, stream=True)
    server = _one_server_span(exporter)
    assert server.context is not None
    trace_id = f"{server.context.trace_id:032x}"
    scrape = httpx.get(gateway.url + "/metrics", headers={"accept": "application/openmetrics-text"})
    assert scrape.headers["content-type"].startswith("application/openmetrics-text")
    lines = scrape.text.splitlines()
    for histogram in ("llm_gateway_ttft_seconds_bucket", "llm_gateway_request_duration_seconds_bucket"):
        assert any(line.startswith(histogram) and f'trace_id="{trace_id}"' in line for line in lines)
    plain = httpx.get(gateway.url + "/metrics")
    assert plain.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in plain.text and "llm_gateway_ttft_seconds_bucket" in plain.text


def test_an_unsampled_request_exports_nothing_but_tells_the_engine(servers: list[ServerThread]) -> None:
    engine = start_engine()
    servers.append(engine)
    gateway, exporter = _traced(servers, [engine], sampling_ratio=0.0)
    _send(gateway, stream=False)
    unsampled_parent = f"00-{CLIENT_TRACE_ID:032x}-{CLIENT_SPAN_ID:016x}-00"
    _send(gateway, stream=True, headers={"traceparent": unsampled_parent})
    assert wait_until(lambda: len(engine_posts(engine)) == 2)
    first, second = (p["traceparent"] for p in engine_posts(engine))
    assert int(first[-2:], 16) & 0x01 == 0 and int(second[-2:], 16) & 0x01 == 0
    assert second.split("-")[1] == f"{CLIENT_TRACE_ID:032x}"  # the client's trace, not sampled
    assert exporter.get_finished_spans() == ()
    scrape = httpx.get(gateway.url + "/metrics", headers={"accept": "application/openmetrics-text"})
    assert "trace_id" not in scrape.text


def test_without_tracing_the_clients_traceparent_goes_upstream_unchanged(
    servers: list[ServerThread],
) -> None:
    engine = start_engine()
    servers.append(engine)
    gateway = start_traced_gateway(gateway_settings([_pool([engine])]), InMemorySpanExporter())
    servers.append(gateway)
    _send(gateway, stream=False, headers={"traceparent": TRACEPARENT})
    assert engine_posts(engine)[-1]["traceparent"] == TRACEPARENT
    assert gateway.app.state.observer.tracer is None
