"""The gateway's own paths in the OpenAPI document (`gateway.api.openapi`): the model list, liveness,
readiness, metrics and the document itself — answered by the gateway, never proxied, so none carries
the proxied operations' headers or error contract. Apart from the proxied operations because their
shapes are the gateway's, written out here, where the proxied ones are built from `Endpoint`.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _get(operation_id: str, summary: str, content: Schema, errors_by_status: dict[str, Schema]) -> Schema:
    return {
        "get": {
            "operationId": operation_id,
            "summary": summary,
            "responses": {"200": {"description": summary, "content": content}, **errors_by_status},
        }
    }


def ops_paths(internal: Schema, unauthorized: Schema, openapi_path: str) -> dict[str, Schema]:
    """The gateway's own paths: models list, liveness, readiness, metrics and `openapi_path` (this
    document); `internal` and `unauthorized` are the references to their error responses."""
    json_object = {"application/json": {"schema": {"type": "object", "additionalProperties": True}}}
    models = {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["object", "data"],
                "properties": {
                    "object": {"const": "list"},
                    "data": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["id", "object"],
                            "properties": {"id": {"type": "string"}, "object": {"const": "model"}},
                        },
                    },
                },
            }
        }
    }
    health = {
        "application/json": {
            "schema": {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}
        }
    }
    ready = {"$ref": "#/components/schemas/Readiness"}
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {
        "/v1/models": _get(
            "list_models",
            "Models with at least one eligible replica (OpenAI list format)",
            models,
            {"401": unauthorized, "500": internal},
        ),
        "/healthz": _get("healthz", "Liveness", health, {"500": internal}),
        "/health": _get("health", "Liveness (as vLLM serves it)", health, {"500": internal}),
        "/readyz": _get(
            "readyz",
            "Readiness: 503 while draining or before every pool knows its replicas",
            {"application/json": {"schema": ready}},
            {"503": {"description": "Not ready", "content": {"application/json": {"schema": ready}}}},
        ),
        "/metrics": _get("metrics", "Prometheus text format", text, {"500": internal}),
        openapi_path: _get("openapi", "This document", json_object, {}),
    }
