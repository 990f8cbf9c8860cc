"""Parse an OpenAI request body just enough to route and account it; the body is forwarded unchanged.

Extracted: model, stream, max_tokens (`max_completion_tokens` or `max_tokens`), whether the client asked
for streamed usage, and the canonical prompt text for routing keys (`router.keys.canonical_prompt_text`).
Wrong types raise `BadRequest` naming the field. The only rewrites (`rewrite_body`) are the pool's
upstream model name and, for streams, asking the engine for usage (`stream_options.include_usage`) so
the gateway can account tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from core.tokens import estimate_tokens
from gateway.errors import BadRequest
from router.keys import canonical_prompt_text


class Endpoint(StrEnum):
    """Proxied endpoints; the value is the upstream path."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"
    TOKENIZE = "/tokenize"
    DETOKENIZE = "/detokenize"

    @property
    def can_stream(self) -> bool:
        return self in (Endpoint.CHAT, Endpoint.COMPLETIONS)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    raw: bytes
    model: str
    stream: bool
    max_tokens: int | None
    client_wants_usage: bool
    prompt_text: str
    user: str | None

    @property
    def estimated_prompt_tokens(self) -> int:
        return estimate_tokens(self.prompt_text)


def _validate_prompt(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """The prompt fields the endpoint needs are present and shaped right (the engine checks the rest)."""
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'")
        return
    required = {Endpoint.COMPLETIONS: "prompt", Endpoint.EMBEDDINGS: "input"}.get(endpoint)
    if required is not None and body.get(required) is None:
        raise BadRequest(f"'{required}' is required")


MAX_BODY_NESTING = 128
"""Deepest nesting accepted anywhere in a body (tool schemas, unknown fields): the gateway re-serialises
bodies (model rewrite, usage injection, quarantine fingerprints), and orjson writes at most 254 levels.
Deeper is a 400, never a 500."""
MAX_PROMPT_NESTING = 16
"""Deepest nesting of objects and arrays accepted inside a prompt-bearing value (a chat message's
`content`, `prompt`, `input`): real content parts are 3 deep (content → part → image_url). Deeper is a
400 naming the field, before anything walks the value."""


def _depth_over(value: object, limit: int) -> bool:
    """True when `value` nests objects/arrays deeper than `limit` (an explicit stack, no recursion)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _check_nesting(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list | dict) and _depth_over(content, MAX_PROMPT_NESTING):
                raise BadRequest(f"'messages[{i}].content' is nested deeper than {MAX_PROMPT_NESTING} levels")
    for name in ("prompt", "input"):
        value = body.get(name)
        if isinstance(value, list | dict) and _depth_over(value, MAX_PROMPT_NESTING):
            raise BadRequest(f"'{name}' is nested deeper than {MAX_PROMPT_NESTING} levels")


def _optional_int(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"'{name}' must be a non-negative integer")
        return value
    return None


def parse_request(endpoint: Endpoint, raw: bytes) -> ParsedRequest:
    """Validate the fields the gateway reads; everything else is the engine's business."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string")
    stream = body.get("stream")
    if stream is None:  # absent or null: not streamed (the OpenAI API and vLLM read null as false)
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean")
    if stream and not endpoint.can_stream:
        raise BadRequest(f"streaming is not supported on {endpoint.value}")
    _validate_prompt(endpoint, body)
    _check_nesting(body)
    # fewer opening brackets than the limit cannot nest past it: most bodies skip the walk (C-speed count)
    could_be_deep = raw.count(b"[") + raw.count(b"{") > MAX_BODY_NESTING
    if could_be_deep and _depth_over(body, MAX_BODY_NESTING):
        raise BadRequest(f"request body is nested deeper than {MAX_BODY_NESTING} levels")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object")
    user = body.get("user")
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        raw=raw,
        model=model,
        stream=stream,
        max_tokens=_optional_int(body, "max_completion_tokens", "max_tokens"),
        client_wants_usage=bool(stream_options and stream_options.get("include_usage")),
        prompt_text=canonical_prompt_text(body),
        user=user if isinstance(user, str) and user else None,
    )


def rewrite_body(parsed: ParsedRequest, upstream_model: str | None) -> bytes:
    """The bytes to send upstream: the original body unless a rewrite is needed (module docstring)."""
    needs_usage = parsed.stream and not parsed.client_wants_usage
    if not needs_usage and (upstream_model is None or upstream_model == parsed.model):
        return parsed.raw
    body = dict(parsed.body)
    if upstream_model is not None:
        body["model"] = upstream_model
    if needs_usage:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(body)
