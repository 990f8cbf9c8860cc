from __future__ import annotations

import orjson
import pytest

from gateway.base.error_mapping import to_response, to_sse_event
from gateway.base.errors import (
    BadRequest,
    Draining,
    NoReplica,
    QueueFull,
    RateLimited,
    UpstreamStatusError,
    UpstreamTTFTTimeout,
)


@pytest.mark.parametrize(
    ("error", "status", "reason", "retry_after"),
    [
        (BadRequest("x"), 400, "bad_request", None),
        (RateLimited("x", retry_after_s=0.2), 429, "rate_limited", "1"),
        (QueueFull("x", retry_after_s=3.01), 429, "queue_full", "4"),
        (NoReplica("x", retry_after_s=2), 503, "no_replica", "2"),
        (Draining("x", retry_after_s=5), 503, "draining", "5"),
        (UpstreamTTFTTimeout("x"), 504, "upstream_ttft_timeout", None),
    ],
)
def test_status_reason_and_retry_after(error, status: int, reason: str, retry_after: str | None) -> None:
    answer = to_response(error)
    headers = dict(answer.headers)
    assert answer.status == status
    assert headers["x-gateway-reject-reason"] == reason
    assert headers.get("retry-after") == retry_after
    assert orjson.loads(answer.body)["error"]["code"] == reason


def test_upstream_status_passes_body_through() -> None:
    error = UpstreamStatusError("x", status=418, body=b"teapot", content_type="text/plain", retry_after_s=9)
    answer = to_response(error)
    assert (answer.status, answer.body) == (418, b"teapot")
    assert dict(answer.headers)["retry-after"] == "9"
    assert dict(answer.headers)["content-type"] == "text/plain"


def test_terminal_sse_event() -> None:
    event = to_sse_event(UpstreamTTFTTimeout("too slow"))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:])["error"] == {
        "message": "too slow",
        "type": "timeout",
        "code": "upstream_ttft_timeout",
    }
