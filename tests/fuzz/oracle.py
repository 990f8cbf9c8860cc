"""What the gateway must answer a proxied request before any engine sees it, from the documented rules
(README "Error contract", the OpenAPI document, `gateway/api/request_parsing.py`'s docstrings): the
status and reason of the first check that refuses it, in the handler's order (body size 413 → JSON and
fields 400 → model 404 → timer headers 400), or None when the gateway must pass it to an engine.

The rules are restated here, not imported, so the suite checks the parser instead of repeating it; only
the JSON decoder (orjson, whose limits are part of what a client sees) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.api.request_parsing import Endpoint

MAX_PROMPT_NESTING = 16
"""README/request_parsing: a prompt-bearing value nested deeper than this is a 400."""
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
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return True
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return True
    if endpoint is Endpoint.COMPLETIONS and body.get("prompt") is None:
        return True
    if endpoint is Endpoint.EMBEDDINGS and body.get("input") is None:
        return True
    if any(_nesting(body.get(name)) > MAX_PROMPT_NESTING for name in ("prompt", "input")):
        return True
    messages = body.get("messages")  # read for the routing key on every endpoint, so limited everywhere
    if isinstance(messages, list) and any(
        isinstance(m, dict) and _nesting(m.get("content")) > MAX_PROMPT_NESTING for m in messages
    ):
        return True
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
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
    models: frozenset[str],
    max_body_bytes: int,
) -> Refusal | None:
    """The gateway's own answer to this request, or None when an engine must get it."""
    if len(raw) > max_body_bytes:
        return 413, "too_large"
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return BAD_REQUEST
    if body_refusal(endpoint, body):
        return BAD_REQUEST
    if body["model"] not in models:
        return 404, "model_not_found"
    if any(name in headers and _timer_refused(headers[name]) for name in TIMER_HEADERS):
        return BAD_REQUEST
    return None
