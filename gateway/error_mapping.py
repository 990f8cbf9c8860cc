"""The one mapping from `GatewayError` to what the client receives.

Before a response has started: status, headers (`x-gateway-reject-reason`, `Retry-After` when the error
carries one, `content-type`), OpenAI-style body `{"error": {"message", "type", "code"}}`.
After a stream has started: one final SSE event `data: {"error": {...}}` and the stream ends.
Upstream status errors pass the replica's status and body through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.errors import GatewayError, MethodNotAllowed, UpstreamStatusError

REJECT_REASON_HEADER = "x-gateway-reject-reason"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def error_body(error: GatewayError) -> bytes:
    """The OpenAI-style JSON error body for `error`."""
    return orjson.dumps(
        {"error": {"message": error.message, "type": error.error_type, "code": str(error.code)}}
    )


def to_response(error: GatewayError) -> ErrorResponse:
    """Status, headers and body for an error answered before any response byte was sent."""
    headers = [(REJECT_REASON_HEADER, str(error.code))]
    retry_after = error.retry_after_header
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    if isinstance(error, MethodNotAllowed):
        headers.append(("allow", ", ".join(error.allow)))
    if isinstance(error, UpstreamStatusError) and error.body:
        headers.append(("content-type", error.content_type or _JSON))
        return ErrorResponse(error.status, headers, error.body)
    headers.append(("content-type", _JSON))
    return ErrorResponse(error.status, headers, error_body(error))


def to_sse_event(error: GatewayError) -> bytes:
    """The terminal SSE event for an error after the stream started (the stream ends after it)."""
    return b"data: " + error_body(error) + b"\n\n"
