"""What the gateway must answer a proxied request before any engine sees it, from the documented rules
(docs/API.md "Error contract", the OpenAPI document, `gateway/api/request_parsing.py`'s docstrings): the
status and reason of the first check that refuses it, in the handler's order (body size 413 → JSON and
fields 400 → stored response unknown 404 → model 404 → endpoint not served by the pool 404 → stored
response held by another pool 404 → timer headers 400), or None when the gateway must pass it to an
engine.

The stored-response lookup (`previous_response_id`) comes before the model check: that is the order the
handler runs them in (`ProxyHandler._parse` locates the id while parsing), not the one its docstring
lists (model, endpoint, then stored response) — a request naming an unknown model and an unknown stored
response is a 404 `response_not_found`, not `model_not_found`. Both are 404s; the oracle follows the code.

The rules are restated here, not imported, so the suite checks the parser instead of repeating it; only
the JSON decoder (orjson, whose limits are part of what a client sees) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.api.request_parsing import Endpoint

MAX_PROMPT_NESTING = 16
"""docs/API.md / request_parsing: a prompt-bearing value nested deeper than this is a 400."""
TIMER_HEADERS = ("x-gateway-ttft-timeout-ms", "x-gateway-idle-timeout-ms")

Refusal = tuple[int, str]
BAD_REQUEST: Refusal = (400, "bad_request")


def _nesting(value: Any) -> int:
    """Levels of objects/arrays in `value` (a scalar is 0); generated values are shallow."""
    if isinstance(value, dict):
        return 1 + max((_nesting(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_nesting(v) for v in value), default=0)
    return 0


def _is_count(value: Any) -> bool:
    """An integer field's value the gateway takes: a JSON number with an integral value (`4.0` too) in
    [0, 2^63 - 1]."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


_MESSAGES_ENDPOINTS = (Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.COUNT_TOKENS)
_REQUIRED = {
    Endpoint.COMPLETIONS: ("prompt",),
    Endpoint.EMBEDDINGS: ("input",),
    Endpoint.RERANK: ("query", "documents"),
    Endpoint.RERANK_UNVERSIONED: ("query", "documents"),
    Endpoint.POOLING: ("input",),
    Endpoint.CLASSIFY: ("input",),
    Endpoint.RESPONSES: ("input",),
}
"""Fields that must be present and not null."""
_PROMPT_FIELDS = ("prompt", "input", "query", "documents", "text_1", "text_2", "system")
"""Prompt-bearing fields, limited to 16 levels of nesting on every endpoint."""


def body_refusal(endpoint: Endpoint, body: Any) -> bool:
    """True when the decoded body breaks a rule of the fields the gateway reads."""
    if not isinstance(body, dict):
        return True
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return True
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return True
    if stream and not endpoint.can_stream:
        return True
    if endpoint in _MESSAGES_ENDPOINTS:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return True
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return True
    if any(body.get(name) is None for name in _REQUIRED.get(endpoint, ())):
        return True
    previous = body.get("previous_response_id")
    if (
        endpoint is Endpoint.RESPONSES
        and previous is not None
        and (not isinstance(previous, str) or not previous)
    ):
        return True
    if any(_nesting(body.get(name)) > MAX_PROMPT_NESTING for name in _PROMPT_FIELDS):
        return True
    messages = body.get("messages")  # read for the routing key on every endpoint, so limited everywhere
    if isinstance(messages, list) and any(
        isinstance(m, dict) and _nesting(m.get("content")) > MAX_PROMPT_NESTING for m in messages
    ):
        return True
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return True
    output = body.get("max_output_tokens")  # the Responses API's own, checked before the others
    if endpoint is Endpoint.RESPONSES and output is not None and not _is_count(output):
        return True
    n = body.get("n")  # read by chat and completions (a stream's continuation)
    if endpoint in (Endpoint.CHAT, Endpoint.COMPLETIONS) and n is not None and not _is_count(n):
        return True
    for name in ("max_completion_tokens", "max_tokens"):  # the first one set is the one read
        value = body.get(name)
        if value is not None:
            return not _is_count(value)
    return False


def _timer_refused(value: bytes) -> bool:
    try:
        return int(value.decode("latin-1")) <= 0
    except ValueError:
        return True


def expected_refusal(
    endpoint: Endpoint,
    raw: bytes,
    headers: Mapping[str, bytes],
    *,
    served: Mapping[str, frozenset[str]],
    stored: Mapping[str, str],
    max_body_bytes: int,
) -> Refusal | None:
    """The gateway's own answer to this request, or None when an engine must get it. `served`: each
    pool's model → the endpoints (capabilities) it serves; `stored`: response id → the pool holding it."""
    if len(raw) > max_body_bytes:
        return 413, "too_large"
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return BAD_REQUEST
    if body_refusal(endpoint, body):
        return BAD_REQUEST
    previous = body.get("previous_response_id") if endpoint is Endpoint.RESPONSES else None
    if previous is not None and previous not in stored:
        return 404, "response_not_found"
    model = body["model"]
    if model not in served:
        return 404, "model_not_found"
    if endpoint.capability not in served[model]:
        return 404, "endpoint_not_served"
    if previous is not None and stored[previous] != model:
        return 404, "response_state_lost"
    return header_refusal(headers)


def header_refusal(headers: Mapping[str, bytes]) -> Refusal | None:
    """A 400 for a timer header that is no positive integer, else None."""
    if any(name in headers and _timer_refused(headers[name]) for name in TIMER_HEADERS):
        return BAD_REQUEST
    return None


def response_call_refusal(
    response_id: str, model: str | None, headers: Mapping[str, bytes], *, served: Mapping[str, frozenset[str]]
) -> Refusal | None:
    """The gateway's own answer to a `/v1/responses/{id}[/cancel]` call of a method the path answers:
    404 `response_not_found` when it has no record of the id (`model` None), `endpoint_not_served` if
    the holding pool no longer serves Responses, then the timer headers; else None (the holder answers)."""
    if model is None:
        return 404, "response_not_found"
    if "responses" not in served[model]:
        return 404, "endpoint_not_served"
    return header_refusal(headers)
