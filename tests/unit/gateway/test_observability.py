"""gateway.observability without servers: which record a request gets, the access log's sampling, the
traceparent parsing, the tracer's exporters."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.base.error_mapping import error_statuses
from gateway.config.observability_settings import AccessLogSettings, TracingSettings
from gateway.config.settings import ConfigError, parse_settings
from gateway.observability.access_log import AccessLog
from gateway.observability.observer import RequestObserver
from gateway.observability.request_record import NO_RECORD, LoggedRecord, client_trace_id
from gateway.observability.request_spans import TracedRecord
from gateway.observability.tracer import TracingUnavailable, build_tracer

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _scope(**headers: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }


def test_both_off_is_the_shared_no_op_record() -> None:
    observer = RequestObserver(TracingSettings(), AccessLogSettings())
    assert observer.begin(_scope(traceparent=TRACEPARENT), "r1") is NO_RECORD
    assert NO_RECORD.exemplar() is None and not NO_RECORD.collects_finish_reasons
    headers = {"x-request-id": "r1"}
    assert NO_RECORD.upstream_headers(headers) is headers


def test_access_log_alone_keeps_facts_and_the_clients_trace_id() -> None:
    observer = RequestObserver(TracingSettings(), AccessLogSettings(enabled=True), random.Random(1))
    record = observer.begin(_scope(traceparent=TRACEPARENT), "r1")
    assert type(record) is LoggedRecord
    assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert record.exemplar() is None


def test_tracing_starts_a_server_span_under_the_clients_context() -> None:
    exporter = InMemorySpanExporter()
    observer = RequestObserver(TracingSettings(enabled=True), AccessLogSettings(), span_exporter=exporter)
    record = observer.begin(_scope(traceparent=TRACEPARENT), "r1")
    assert isinstance(record, TracedRecord)
    assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert record.exemplar() is not None and record.exemplar()["trace_id"] == record.trace_id


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TRACEPARENT, "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_client_trace_id(value: str | None, expected: str | None) -> None:
    assert client_trace_id(value) == expected


def test_every_reason_is_logged_with_the_status_its_error_answers() -> None:
    """The access log's status of a refused request is what the client got, the class's own status or
    an inherited one (`QueueFull` answers `Overloaded`'s 429; once logged as 500)."""
    statuses = LoggedRecord._statuses
    assert statuses == {str(code): status for code, status in error_statuses().items()}
    assert statuses["queue_full"] == statuses["rate_limited"] == statuses["queue_timeout"] == 429
    assert statuses["upstream_protocol"] == 502 and statuses["upstream_ttft_timeout"] == 504


def test_sampling_keeps_errors_and_slow_requests() -> None:
    log = AccessLog(AccessLogSettings(enabled=True, sample_ratio=0.0, slow_request_ms=1000), random.Random(1))
    assert not log.keeps("success", 10.0, 5.0, None)
    assert log.keeps("queue_full", 1.0, None, None)
    assert log.keeps("client_disconnect", 1.0, None, None)
    assert log.keeps("success", 1000.0, 5.0, None)  # slow by duration
    assert log.keeps("success", 10.0, 2000.0, 2000.0)  # TTFT over the pool's SLO
    assert not log.keeps("success", 10.0, 1999.0, 2000.0)


def test_sample_ratio_is_a_probability() -> None:
    settings = AccessLogSettings(enabled=True, sample_ratio=0.25, slow_request_ms=None)
    log = AccessLog(settings, random.Random(7))
    kept = sum(log.keeps("success", 1.0, 1.0, None) for _ in range(4000))
    assert 850 < kept < 1150


def test_settings_defaults_are_off_and_validated() -> None:
    settings = parse_settings({})
    assert not settings.tracing.enabled and not settings.access_log.enabled
    with pytest.raises(ConfigError, match=r"tracing\.sampling_ratio"):
        parse_settings({"tracing": {"sampling_ratio": 1.5}})
    with pytest.raises(ConfigError, match=r"tracing\.exporter"):
        parse_settings({"tracing": {"exporter": "zipkin"}})


def test_the_grpc_exporter_needs_its_package() -> None:
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401
    except ImportError:
        with pytest.raises(TracingUnavailable, match="opentelemetry-exporter-otlp-proto-grpc"):
            build_tracer(TracingSettings(enabled=True, exporter="otlp-grpc"))
    else:
        pytest.skip("the gRPC exporter is installed")


def test_the_documented_config_block_shows_the_defaults() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "CONFIGURATION.md").read_text()
    block = page.split("## Every key, with its default", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    settings = parse_settings(yaml.safe_load(block))
    assert settings.tracing == TracingSettings()
    assert settings.access_log == AccessLogSettings()
