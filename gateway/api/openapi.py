"""The OpenAPI 3.1 description of the gateway's client surface, served at `GET /openapi.json`.

A static document, built from the code it describes so it cannot drift: the proxied paths are the
`Endpoint` enum and the Responses API's id calls (`RESPONSE_CALLS`: `GET`/`DELETE
/v1/responses/{response_id}`, `POST …/cancel`, `GET …/input_items`, bodiless); the error responses are
every `ErrorCode`, each under the status its error class in `gateway.base.errors` answers with; the request
headers are the names the serve path reads. Request bodies describe the fields the gateway itself reads
(model, stream, max_tokens, the prompt fields, stream_options, user) with `additionalProperties: true`:
everything else passes through to the engine, which validates it. The admin API (`/admin/...`) is not
part of this surface.

Error responses are the contract of docs/API.md, "Error contract": an OpenAI-style body
`{"error": {"message", "type", "code": <reason>}}` (Anthropic's `{"type": "error", "error": {...}}` on
the Messages endpoints) and the same reason in `x-gateway-reject-reason`;
an engine's own error status is passed through with its body (`upstream_status`, the `default` response).
Those error responses are built in `gateway.api.openapi_errors`, the gateway's own paths (models,
health, readiness, metrics, this document) in `gateway.api.openapi_ops_paths`, the request bodies in
`gateway.api.openapi_bodies`; this module assembles the document from them.
"""

from __future__ import annotations

import copy
from functools import cache
from importlib import metadata
from typing import Any

from gateway.api.openapi_bodies import (
    BODY_FIELDS,
    ERROR_BODIES,
    RESPONSE_CALLS,
    RESPONSE_ID_PARAMETER,
    SUMMARIES,
    TOKEN_COUNT,
)
from gateway.api.openapi_errors import (
    PASSTHROUGH,
    ROUTE_CODES,
    STREAM_TERMINAL_CODES,
    error_response,
    grouped,
    header,
)
from gateway.api.openapi_ops_paths import ops_paths
from gateway.api.request_parsing import Endpoint
from gateway.base.error_mapping import error_statuses
from gateway.base.errors import ErrorCode
from gateway.base.surface import ApiSurface

OPENAPI_PATH = "/openapi.json"
_STREAM_TEXT = {
    ApiSurface.OPENAI: " With `stream: true`, server-sent events ending in `data: [DONE]`; an error after the"
    ' stream started is one final event `data: {{"error": {{...}}}}` with `code` one of {terminal}.',
    ApiSurface.ANTHROPIC: " With `stream: true`, Anthropic's named events (`message_start` … `message_stop`);"
    " an error after the stream started is one final `event: error` (`AnthropicErrorBody`).",
    ApiSurface.RESPONSES: " With `stream: true`, `response.*` events ending in `response.completed`"
    " (`.failed`, `.incomplete`); an error after the stream started is one final `event: error`,"
    ' `{{"type": "error", "code", "message", "param"}}` with `code` one of {terminal}.',
}
Schema = dict[str, Any]
_JSON_OBJECT: Schema = {"schema": {"type": "object", "additionalProperties": True}}

_REQUEST_HEADERS: list[tuple[str, Schema, str]] = [
    ("x-request-id", {"type": "string"}, "Echoed and sent upstream; generated when absent."),
    (
        "x-gateway-priority",
        {"type": "string", "examples": ["critical", "interactive", "batch"]},
        "Priority class (case-insensitive), clamped to the tenant's ceiling; unknown: the default class.",
    ),
    ("x-session-id", {"type": "string"}, "Session-affinity key (else the body's `user`)."),
    (
        "x-gateway-ttft-timeout-ms",
        {"type": "integer", "minimum": 1},
        "First-token deadline override, clamped to `max_ttft_s`; anything but a positive integer is a 400.",
    ),
    (
        "x-gateway-idle-timeout-ms",
        {"type": "integer", "minimum": 1},
        "Inter-chunk deadline override, clamped to `max_idle_s`; anything but a positive integer is a 400.",
    ),
    (
        "Idempotency-Key",
        {"type": "string"},
        "Non-streaming requests: a duplicate gets the first answer, never a second generation.",
    ),
]
_SUCCESS_HEADERS: list[tuple[str, Schema, str]] = [
    ("x-request-id", {"type": "string"}, "The request id (the client's, or generated)."),
    (
        "x-gateway-pool",
        {"type": "string"},
        "The pool that served the request (a fallback pool's, after one).",
    ),
    ("x-gateway-replica", {"type": "string"}, "The replica that served the request."),
    ("x-gateway-route", {"type": "string"}, "`policy=…; branch=…; hops=…[; prefix_blocks=…]`."),
    ("x-gateway-queue-ms", {"type": "string", "pattern": "^[0-9]+$"}, "Time spent queued, in ms."),
    ("Server-Timing", {"type": "string"}, "`queue` and `upstream-ttft` durations where known."),
]


def _request_body(endpoint: Endpoint) -> Schema:
    fields, required = BODY_FIELDS[endpoint]
    stream: Schema = (
        {"type": ["boolean", "null"]}
        if endpoint.can_stream
        else {"enum": [False, None], "description": "streaming is not supported here"}
    )
    properties: dict[str, Schema] = {
        "model": {"type": "string", "minLength": 1, "description": "The pool's model name."},
        "stream": stream,
        "max_tokens": TOKEN_COUNT,
        "max_completion_tokens": TOKEN_COUNT,
        "stream_options": {
            "type": ["object", "null"],
            "properties": {"include_usage": {"type": "boolean"}},
            "additionalProperties": True,
        },
        "user": {"type": "string", "description": "Session-affinity key when `x-session-id` is absent."},
        **fields,
    }
    return {
        "type": "object",
        "required": ["model", *required],
        "properties": properties,
        "additionalProperties": True,
    }


def _proxy_operation(endpoint: Endpoint, error_refs: dict[int, Schema]) -> Schema:
    content: Schema = {"application/json": _JSON_OBJECT}
    description = "The engine's answer, passed through."
    if endpoint.can_stream:
        content["text/event-stream"] = {"schema": {"$ref": "#/components/schemas/EventStream"}}
        terminal = ", ".join(f"`{code}`" for code in STREAM_TERMINAL_CODES)
        description += _STREAM_TEXT[endpoint.surface].format(terminal=terminal)
    if endpoint.surface is ApiSurface.ANTHROPIC:
        description += " Errors have Anthropic's shape (`AnthropicErrorBody`), the reason in the header."
    operation = _operation(endpoint.name.lower(), SUMMARIES[endpoint], description, content, error_refs)
    body = {"application/json": {"schema": _request_body(endpoint)}}
    return {**operation, "requestBody": {"required": True, "content": body}}


def _operation(
    operation_id: str, summary: str, description: str, content: Schema, error_refs: dict[int, Schema]
) -> Schema:
    """A proxied operation: the gateway's request headers, its success headers on the engine's answer,
    every contract error, and an engine's own error status passed through (`default`)."""
    headers = {name: header(schema, text) for name, schema, text in _SUCCESS_HEADERS}
    return {
        "operationId": operation_id,
        "summary": summary,
        "parameters": [{"$ref": f"#/components/parameters/{name}"} for name, _, _ in _REQUEST_HEADERS],
        "responses": {
            "200": {"description": description, "headers": headers, "content": content},
            **{str(status): ref for status, ref in error_refs.items()},
            "default": {
                "description": f"An engine's error status, passed through with its body "
                f"(`x-gateway-reject-reason: {PASSTHROUGH}`).",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EngineErrorBody"}}},
            },
        },
    }


def _response_call_paths(error_refs: dict[int, Schema]) -> dict[str, Schema]:
    """`GET`/`DELETE /v1/responses/{response_id}`, `POST …/cancel`, `GET …/input_items`
    (`RESPONSE_CALLS`): no body, the id in the path; answered by the replica that holds the response,
    or the gateway's 404."""
    paths: dict[str, Schema] = {}
    for call in RESPONSE_CALLS:
        content = {"application/json": _JSON_OBJECT}
        operation = _operation(call.operation_id, call.summary, call.description, content, error_refs)
        operation["parameters"] = [RESPONSE_ID_PARAMETER, *operation["parameters"]]
        paths.setdefault(call.path, {})[call.method] = operation
    return paths


def _components(codes: dict[ErrorCode, int]) -> Schema:
    route_codes = grouped(codes, set(ROUTE_CODES))
    proxy_codes = grouped(codes, set(ErrorCode) - {*ROUTE_CODES, PASSTHROUGH})
    responses = {f"Error{status}": error_response(status, group) for status, group in proxy_codes.items()}
    for status, group in route_codes.items():
        responses[f"Route{status}"] = error_response(status, group, route_level=True)
    responses["Unauthorized"] = error_response(401, [ErrorCode.UNAUTHORIZED], route_level=True)
    responses["Internal"] = error_response(500, [ErrorCode.INTERNAL], route_level=True)
    return {
        "parameters": {
            name: {"name": name, "in": "header", **header(schema, text)}
            for name, schema, text in _REQUEST_HEADERS
        },
        "responses": responses,
        "securitySchemes": {
            "apiKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "A tenant's API key, when tenants are configured.",
            }
        },
        "schemas": {
            **ERROR_BODIES,
            "EventStream": {
                "description": "Server-sent events: `data: <chunk JSON>` per chunk, then `data: [DONE]`; read"
                " as the whole body (a string) or event by event (an object with `data`).",
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "required": ["data"],
                        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                    },
                ],
            },
            "Readiness": {
                "type": "object",
                "required": ["ready"],
                "properties": {"ready": {"type": "boolean"}},
            },
        },
    }


def _version() -> str:
    try:
        return metadata.version("llm-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@cache
def _document() -> Schema:
    codes = error_statuses()
    components = _components(codes)
    proxy_statuses = grouped(codes, set(ErrorCode) - {*ROUTE_CODES, PASSTHROUGH})
    error_refs = {status: {"$ref": f"#/components/responses/Error{status}"} for status in proxy_statuses}
    paths: dict[str, Schema] = {
        endpoint.value: {"post": _proxy_operation(endpoint, error_refs)} for endpoint in Endpoint
    }
    paths.update(_response_call_paths(error_refs))
    paths.update(
        ops_paths(
            {"$ref": "#/components/responses/Internal"},
            {"$ref": "#/components/responses/Unauthorized"},
            OPENAPI_PATH,
        )
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "llm-gateway",
            "version": _version(),
            "description": (
                "OpenAI-compatible routing gateway for fleets of LLM engine replicas. Every error answer"
                " carries `x-gateway-reject-reason` and an OpenAI-style body whose `error.code` is that"
                " reason (on the Anthropic Messages endpoints, Anthropic's error body with the same"
                " status and header); an unknown path is a 404 `not_found` and a wrong method a 405"
                " `method_not_allowed` with `Allow` (components `Route404`, `Route405`)."
            ),
        },
        "security": [{}, {"apiKey": []}],
        "paths": paths,
        "components": components,
    }


def openapi_document() -> Schema:
    """The OpenAPI 3.1 document (a fresh copy: callers may change it)."""
    return copy.deepcopy(_document())
