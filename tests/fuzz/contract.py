"""The assertions every fuzzed answer must pass (docs/API.md "Error contract", the OpenAPI document):

- never a 5xx;
- every 4xx carries `x-gateway-reject-reason`, one the OpenAPI document lists for that status, and a
  JSON body `{"error": {"message", "type", "code"}}` whose `code` is that reason — except an engine's
  own refusal (`upstream_status`), whose body is the engine's, passed through (here the mock engine's
  vLLM-shaped `BadRequestError`, `code` the status);
- on the Anthropic Messages paths (`ANTHROPIC_PATHS`) the gateway's errors have Anthropic's shape
  instead, `{"type": "error", "error": {"type", "message"}}`, `error.type` by status (Anthropic's
  table, `ANTHROPIC_TYPES` below, restated from its API reference); an engine's refusal there is the
  engine's body (the mock: Anthropic-shaped for a field it refuses);
- every proxied answer and every error carries `x-request-id`, the client's when it sent one.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from gateway.api.openapi import openapi_document

REASON = "x-gateway-reject-reason"
UPSTREAM_STATUS = "upstream_status"
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
_RESPONSES = openapi_document()["components"]["responses"]


def documented_reasons(status: int) -> set[str]:
    reasons: set[str] = set()
    for name in (f"Error{status}", f"Route{status}"):
        if name in _RESPONSES:
            reasons.update(_RESPONSES[name]["headers"][REASON]["schema"]["enum"])
    return reasons


def _describe(response: httpx.Response) -> str:
    request = response.request
    return f"{request.method} {request.url.path} → {response.status_code} {response.text[:300]!r}"


def check_error_shape(response: httpx.Response) -> str:
    """Assert the 4xx contract (module docstring); returns the reason."""
    status = response.status_code
    assert REASON in response.headers, f"no {REASON}: {_describe(response)}"
    reason = str(response.headers[REASON])
    assert reason in documented_reasons(status), f"reason {reason!r} not documented for {status}"
    if response.request.method == "HEAD":
        return reason
    try:
        body: Any = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise AssertionError(f"error body is not JSON: {_describe(response)}") from None
    if response.request.url.path in ANTHROPIC_PATHS:
        check_anthropic_body(body, status, reason, _describe(response))
        return reason
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict), f"not an OpenAI-style error body: {_describe(response)}"
    assert isinstance(error.get("message"), str) and isinstance(error.get("type"), str), _describe(response)
    if reason == UPSTREAM_STATUS:
        assert error.get("code") == status, f"engine body not passed through: {_describe(response)}"
    else:
        assert error.get("code") == reason, f"error.code is not the reason: {_describe(response)}"
    return reason


def check_anthropic_body(body: Any, status: int, reason: str, where: str = "") -> None:
    """Anthropic's error shape (module docstring); an engine's refusal (`upstream_status`) needs only an
    error message of either shape."""
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"no error object: {where}"
    error = body["error"]
    assert isinstance(error.get("message"), str) and isinstance(error.get("type"), str), where
    if reason == UPSTREAM_STATUS:
        return
    assert body.get("type") == "error" and set(error) == {"type", "message"}, f"not Anthropic's: {where}"
    assert error["type"] == ANTHROPIC_TYPES.get(status, "api_error"), f"error.type for {status}: {where}"


def check_answer(
    response: httpx.Response, sent_request_id: bytes | None = None, *, request_id: bool = True
) -> None:
    """Never a 5xx; a contract-shaped 4xx; the request id (`request_id`), the client's when it sent one."""
    assert response.status_code < 500, f"server error: {_describe(response)}"
    if response.status_code >= 400:
        check_error_shape(response)
    if not request_id:
        return
    ids = [value for key, value in response.headers.raw if key.lower() == b"x-request-id"]
    assert len(ids) == 1, f"x-request-id: {ids}: {_describe(response)}"
    if sent_request_id:
        assert ids[0] == sent_request_id, (ids[0], sent_request_id)
