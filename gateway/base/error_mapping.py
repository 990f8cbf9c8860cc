"""The one mapping from `GatewayError` to what the client receives.

Before a response has started: status, headers (`x-gateway-reject-reason`, `Retry-After` when the error
carries one, `content-type`), OpenAI-style body `{"error": {"message", "type", "code"}}`.
After a stream has started: one final SSE event `data: {"error": {...}}` and the stream ends.
Upstream status errors pass the replica's status and body through unchanged.

The Anthropic surface (`gateway.base.surface`) renders the same errors, with the same status and
headers, in its own shape: `{"type": "error", "error": {"type": <anthropic type>, "message"}}`, the
type by status (`ANTHROPIC_TYPES`; 5xx other than 503/504 `api_error`), and a terminal
`event: error` with that body. The Responses surface answers before the start as OpenAI, and ends a
started stream with `event: error` / `{"type": "error", "code": <reason>, "message", "param": null}`.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.base.errors import ErrorCode, GatewayError, MethodNotAllowed, UpstreamStatusError
from gateway.base.surface import ApiSurface

REJECT_REASON_HEADER = "x-gateway-reject-reason"
_JSON = "application/json"
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
"""Anthropic's `error.type` by HTTP status; any other status is `api_error`."""


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


def anthropic_error_body(error: GatewayError) -> bytes:
    """The Anthropic-style JSON error body for `error` (module docstring)."""
    kind = ANTHROPIC_TYPES.get(error.status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def to_response(error: GatewayError, surface: ApiSurface = ApiSurface.OPENAI) -> ErrorResponse:
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
    body = anthropic_error_body(error) if surface is ApiSurface.ANTHROPIC else error_body(error)
    return ErrorResponse(error.status, headers, body)


def to_sse_event(error: GatewayError, surface: ApiSurface = ApiSurface.OPENAI) -> bytes:
    """The terminal SSE event for an error after the stream started (the stream ends after it)."""
    if surface is ApiSurface.ANTHROPIC:
        return b"event: error\ndata: " + anthropic_error_body(error) + b"\n\n"
    if surface is ApiSurface.RESPONSES:
        data = {"type": "error", "code": str(error.code), "message": error.message, "param": None}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"
    return b"data: " + error_body(error) + b"\n\n"


def error_statuses() -> dict[ErrorCode, int]:
    """Every reason and the status its error class in `gateway.base.errors` answers with, own or inherited
    (`upstream_status`: 502 here, in fact the engine's own status): what the OpenAPI document promises and
    the access log records. Raises when a code has no class (the contract drifted)."""
    found: dict[ErrorCode, int] = {}
    pending = list(GatewayError.__subclasses__())  # the base's own code is a default, not an answer
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ != GatewayError.__module__ or "code" not in vars(cls):
            continue
        if found.setdefault(cls.code, cls.status) != cls.status:
            raise RuntimeError(f"{cls.code} is answered with two statuses: {found[cls.code]}, {cls.status}")
    missing = [code.value for code in ErrorCode if code not in found]
    if missing:
        raise RuntimeError(f"no error class in gateway.base.errors answers {', '.join(missing)}")
    return {code: found[code] for code in ErrorCode}
