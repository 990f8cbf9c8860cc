"""The request bodies of the proxied endpoints as the OpenAPI document describes them
(`gateway.api.openapi`): only the fields the gateway itself reads, each endpoint's summary."""

from __future__ import annotations

from typing import Any

from gateway.api.request_parsing import Endpoint

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
