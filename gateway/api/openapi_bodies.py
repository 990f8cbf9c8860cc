"""The request bodies of the proxied endpoints as the OpenAPI document describes them
(`gateway.api.openapi`): only the fields the gateway itself reads, each endpoint's summary; the error
bodies' schemas; and the Responses API's bodiless id calls (`RESPONSE_CALLS`, the paths
`gateway.api.response_calls` routes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.request_parsing import Endpoint
from gateway.api.response_calls import RESPONSES_PREFIX
from gateway.base.errors import ErrorCode

Schema = dict[str, Any]
_NOT_NULL: Schema = {"not": {"type": "null"}}
_MESSAGES: Schema = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["role"],
        "properties": {"role": {"type": "string"}},
        "additionalProperties": True,
    },
}

SUMMARIES: dict[Endpoint, str] = {
    Endpoint.CHAT: "OpenAI chat completion, streamed (SSE) or not",
    Endpoint.COMPLETIONS: "OpenAI text completion, streamed (SSE) or not",
    Endpoint.EMBEDDINGS: "OpenAI embeddings",
    Endpoint.TOKENIZE: "vLLM tokenize, passed to a replica of the model named in the body",
    Endpoint.DETOKENIZE: "vLLM detokenize, passed to a replica of the model named in the body",
    Endpoint.RERANK: "Rerank documents for a query (vLLM, SGLang, llama.cpp)",
    Endpoint.RERANK_UNVERSIONED: "Rerank documents for a query (the unversioned path)",
    Endpoint.SCORE: "vLLM score: similarity of text pairs",
    Endpoint.POOLING: "vLLM pooling: the pooled hidden states of the input",
    Endpoint.CLASSIFY: "vLLM classify: class probabilities of the input",
    Endpoint.MESSAGES: "Anthropic Messages, streamed (SSE) or not; Anthropic-shaped errors",
    Endpoint.COUNT_TOKENS: "Anthropic Messages token count; Anthropic-shaped errors",
    Endpoint.RESPONSES: "OpenAI Responses, streamed (SSE) or not, with state affinity for stored responses",
}
PROMPT: Schema = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    ]
}
TOKEN_COUNT: Schema = {"type": ["integer", "null"], "minimum": 0}
BODY_FIELDS: dict[Endpoint, tuple[dict[str, Schema], list[str]]] = {
    Endpoint.CHAT: ({"messages": _MESSAGES}, ["messages"]),
    Endpoint.COMPLETIONS: ({"prompt": PROMPT}, ["prompt"]),
    Endpoint.EMBEDDINGS: ({"input": PROMPT}, ["input"]),
    Endpoint.TOKENIZE: ({"prompt": {"type": "string"}}, ["prompt"]),
    Endpoint.DETOKENIZE: ({"tokens": {"type": "array", "items": {"type": "integer"}}}, ["tokens"]),
    Endpoint.RERANK: ({"query": _NOT_NULL, "documents": _NOT_NULL}, ["query", "documents"]),
    Endpoint.RERANK_UNVERSIONED: ({"query": _NOT_NULL, "documents": _NOT_NULL}, ["query", "documents"]),
    Endpoint.SCORE: ({}, []),
    Endpoint.POOLING: ({"input": _NOT_NULL}, ["input"]),
    Endpoint.CLASSIFY: ({"input": _NOT_NULL}, ["input"]),
    Endpoint.MESSAGES: ({"messages": _MESSAGES}, ["messages"]),
    Endpoint.COUNT_TOKENS: ({"messages": _MESSAGES}, ["messages"]),
    Endpoint.RESPONSES: (
        {
            "input": _NOT_NULL,
            "max_output_tokens": TOKEN_COUNT,
            "previous_response_id": {
                "type": ["string", "null"],
                "minLength": 1,
                "description": "Routed to the replica that stored it (404 `response_not_found` / "
                "`response_state_lost` when it cannot be).",
            },
        },
        ["input"],
    ),
}


@dataclass(frozen=True, slots=True)
class ResponseCallDoc:
    """One documented `/v1/responses/{response_id}[/cancel|/input_items]` operation."""

    path: str
    method: str
    operation_id: str
    summary: str
    description: str


_AFFINITY = (
    " Sent to the replica that holds the response (state affinity); the gateway answers 404"
    " `response_not_found` for an id it has no record of (never relayed through it, deleted through it,"
    " or expired) and 404 `response_state_lost` when the replica that held it left the pool or is not"
    " routable. Any other answer is the engine's, passed through."
)
_ID_PATH = RESPONSES_PREFIX + "{response_id}"
RESPONSE_CALLS = (
    ResponseCallDoc(
        _ID_PATH, "get", "retrieve_response", "OpenAI Responses: retrieve a stored response", _AFFINITY
    ),
    ResponseCallDoc(
        _ID_PATH,
        "delete",
        "delete_response",
        "OpenAI Responses: delete a stored response",
        _AFFINITY
        + " A 2xx answer drops the gateway's record: later calls on the id are `response_not_found`.",
    ),
    ResponseCallDoc(
        _ID_PATH + "/cancel",
        "post",
        "cancel_response",
        "OpenAI Responses: cancel a background response",
        _AFFINITY + " No request body.",
    ),
    ResponseCallDoc(
        _ID_PATH + "/input_items",
        "get",
        "list_response_input_items",
        "OpenAI Responses: the input items of a stored response",
        _AFFINITY,
    ),
)
RESPONSE_ID_PARAMETER: Schema = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "description": "The id of a response the gateway relayed (`response.id`, e.g. `resp_…`).",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
}
ERROR_BODIES: dict[str, Schema] = {
    "ErrorBody": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"type": "string", "enum": [str(code) for code in ErrorCode]},
                },
            }
        },
    },
    "AnthropicErrorBody": {
        "description": "The gateway's errors on the Anthropic Messages endpoints.",
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "EngineErrorBody": {
        "description": "An engine's own error body, passed through unchanged "
        f"(`x-gateway-reject-reason: {ErrorCode.UPSTREAM_STATUS}`); OpenAI-style for vLLM.",
    },
}
"""The error bodies' component schemas: the gateway's (OpenAI-style, Anthropic-style on the Messages
surface) and an engine's passed through."""
