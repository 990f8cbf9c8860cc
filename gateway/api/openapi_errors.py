"""The error contract as the OpenAPI document describes it (`gateway.api.openapi`): every `ErrorCode`
with the status its error class in `gateway.base.errors` answers with (found from the classes, so the
document cannot drift from them), and the error responses built from it — the reason header,
Retry-After on 429 and 503, `Allow` on 405, and the OpenAI, Anthropic or engine error body. Apart from
the document's assembly because it is the one place the document reads the error hierarchy.
"""

from __future__ import annotations

from typing import Any

from gateway.base.errors import ErrorCode

Schema = dict[str, Any]
STREAM_TERMINAL_CODES = (
    ErrorCode.UPSTREAM_IDLE_TIMEOUT,
    ErrorCode.UPSTREAM_PROTOCOL,
    ErrorCode.UPSTREAM_TOTAL_TIMEOUT,
    ErrorCode.DRAINING,
    ErrorCode.INTERNAL,
)
"""The `code` of the terminal SSE error event of a stream that had started (DESIGN §4)."""
ROUTE_CODES = (ErrorCode.NOT_FOUND, ErrorCode.METHOD_NOT_ALLOWED)
"""Answers for a path or method the surface does not have: no operation answers them."""
PASSTHROUGH = ErrorCode.UPSTREAM_STATUS
"""An engine's error status and body, passed through: any status (`default`), and a reason of every one."""
RETRY_AFTER_STATUSES = (429, 503)


def header(schema: Schema, description: str, required: bool = False) -> Schema:
    """An OpenAPI header object."""
    return {"description": description, "required": required, "schema": schema}


def error_response(status: int, codes: list[ErrorCode], *, route_level: bool = False) -> Schema:
    """The response answering `codes` with `status`: the reason header, Retry-After where the status
    carries one, and the error body; a route-level answer (no operation, the gateway's own) has the
    OpenAI-style body only and no passed-through engine error."""
    reasons = [str(code) for code in codes]
    passthrough = "" if route_level else f" or `{PASSTHROUGH}` (an engine's {status}, its body)"
    headers = {
        "x-gateway-reject-reason": header(
            {"type": "string", "enum": reasons if route_level else [*reasons, str(PASSTHROUGH)]},
            "The reason; equals the body's `error.code` for the gateway's own errors.",
            required=True,
        ),
        "x-request-id": header({"type": "string"}, "The request id."),
    }
    if status == 405:
        headers["Allow"] = header({"type": "string"}, "The methods the path accepts.", required=True)
    if status in RETRY_AFTER_STATUSES:
        headers["Retry-After"] = header(
            {"type": "string", "pattern": "^[1-9][0-9]*$"},
            "Whole seconds >= 1, computed from the situation (never a constant).",
        )
    body: Schema = {"$ref": "#/components/schemas/ErrorBody"}
    if not route_level:
        anthropic = {"$ref": "#/components/schemas/AnthropicErrorBody"}
        body = {"anyOf": [body, anthropic, {"$ref": "#/components/schemas/EngineErrorBody"}]}
    return {
        "description": f"`{'`, `'.join(reasons)}`{passthrough}.",
        "headers": headers,
        "content": {"application/json": {"schema": body}},
    }


def grouped(codes: dict[ErrorCode, int], wanted: set[ErrorCode]) -> dict[int, list[ErrorCode]]:
    """The `wanted` codes by the status that answers them, statuses in order."""
    by_status: dict[int, list[ErrorCode]] = {}
    for code, status in codes.items():
        if code in wanted:
            by_status.setdefault(status, []).append(code)
    return dict(sorted(by_status.items()))
