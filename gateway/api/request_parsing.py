"""Parse a request body just enough to route and account it; the body is forwarded unchanged.

Extracted: model, stream, max_tokens (`max_completion_tokens` or `max_tokens`; `max_output_tokens` on
the Responses API), `n` (chat and completions), whether the client asked for streamed usage,
`previous_response_id` (Responses), and the canonical prompt text for routing keys
(`router.keys.canonical_prompt_text`; for the Anthropic, Responses and pooling bodies the same rendering
of their own fields, `_prompt_text`). Wrong types raise `BadRequest` naming the field. An integer field
takes any JSON number with an integral value (`4`, `4.0`, `1e2`: vLLM's and pydantic's reading) from 0
to 2^63 - 1 (`MAX_INTEGER`); a fraction, a negative or a larger value is a 400 naming the field
(integers and nesting limits: `gateway.api.body_limits`). The
only rewrites (`rewrite_body`) are the pool's upstream model name and, for chat/completions streams,
asking the engine for usage (`stream_options.include_usage`) so the gateway can account tokens (the
Anthropic and Responses streams always carry their usage); otherwise the body goes upstream as the
client wrote it.

`/v1/responses/{id}` calls (retrieve, delete, cancel, input items) have no body that names a model: they
are parsed by `parse_response_call` once the response-state store has told which pool holds the id.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from core.tokens import estimate_tokens
from gateway.api.body_limits import MAX_BODY_NESTING, check_nesting, depth_over, optional_int
from gateway.base.errors import BadRequest
from gateway.base.surface import ApiSurface
from router.keys import canonical_prompt_text


class Endpoint(StrEnum):
    """Proxied endpoints; the value is the client's path and the upstream path."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"
    TOKENIZE = "/tokenize"
    DETOKENIZE = "/detokenize"
    RERANK = "/v1/rerank"
    RERANK_UNVERSIONED = "/rerank"
    SCORE = "/v1/score"
    POOLING = "/pooling"
    CLASSIFY = "/classify"
    MESSAGES = "/v1/messages"
    COUNT_TOKENS = "/v1/messages/count_tokens"
    RESPONSES = "/v1/responses"

    @property
    def can_stream(self) -> bool:
        return self in _STREAMING

    @property
    def capability(self) -> str:
        """The name a pool's `endpoints` setting uses for this endpoint (`rerank` for both rerank paths,
        `messages` for `/v1/messages` and its `count_tokens`)."""
        return _CAPABILITIES.get(self, self.name.lower())

    @property
    def surface(self) -> ApiSurface:
        """The API family: how errors are rendered and stream events read (`gateway.base.surface`)."""
        if self in (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS):
            return ApiSurface.ANTHROPIC
        if self is Endpoint.RESPONSES:
            return ApiSurface.RESPONSES
        return ApiSurface.OPENAI


_STREAMING = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.MESSAGES, Endpoint.RESPONSES})
_CAPABILITIES = {
    Endpoint.CHAT: "chat",
    Endpoint.RERANK_UNVERSIONED: "rerank",
    Endpoint.COUNT_TOKENS: "messages",
}
_USAGE_INJECTED = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS})
"""Streams whose usage the gateway asks for (`stream_options.include_usage`) and strips again."""
_MAX_TOKENS_FIELDS = {Endpoint.RESPONSES: ("max_output_tokens",)}
_REQUIRED_FIELDS = {
    Endpoint.COMPLETIONS: ("prompt",),
    Endpoint.EMBEDDINGS: ("input",),
    Endpoint.RERANK: ("query", "documents"),
    Endpoint.RERANK_UNVERSIONED: ("query", "documents"),
    Endpoint.POOLING: ("input",),
    Endpoint.CLASSIFY: ("input",),
    Endpoint.RESPONSES: ("input",),
}


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
    n: int | None = None
    """Chat and completions: the choices asked for (None: absent, the engine's default of 1)."""
    previous_response_id: str | None = None
    """Responses API: the stored response this one continues (state affinity pins its replica)."""
    method: str = "POST"
    path: str | None = None
    """The upstream path when it is not the endpoint's (a `/v1/responses/{id}` call)."""

    @property
    def upstream_path(self) -> str:
        """The path sent upstream (with the query string of a `/v1/responses/{id}` call)."""
        return self.path or self.endpoint.value

    @property
    def estimated_prompt_tokens(self) -> int:
        return estimate_tokens(self.prompt_text)


def _validate_prompt(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """The prompt fields the endpoint needs are present and shaped right (the engine checks the rest)."""
    if endpoint in (Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.COUNT_TOKENS):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'")
        return
    for required in _REQUIRED_FIELDS.get(endpoint, ()):
        if body.get(required) is None:
            raise BadRequest(f"'{required}' is required")
    previous = body.get("previous_response_id")
    if (
        endpoint is Endpoint.RESPONSES
        and previous is not None
        and (not isinstance(previous, str) or not previous)
    ):
        raise BadRequest("'previous_response_id' must be a non-empty string")


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
    check_nesting(body)
    # fewer opening brackets than the limit cannot nest past it: most bodies skip the walk (C-speed count)
    could_be_deep = raw.count(b"[") + raw.count(b"{") > MAX_BODY_NESTING
    if could_be_deep and depth_over(body, MAX_BODY_NESTING):
        raise BadRequest(f"request body is nested deeper than {MAX_BODY_NESTING} levels")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise BadRequest("'stream_options' must be an object")
    user = body.get("user")
    max_tokens_fields = _MAX_TOKENS_FIELDS.get(endpoint, ("max_completion_tokens", "max_tokens"))
    max_tokens = optional_int(body, *max_tokens_fields)
    if max_tokens_fields != ("max_completion_tokens", "max_tokens"):
        optional_int(body, "max_completion_tokens", "max_tokens")  # still type-checked everywhere
    n = optional_int(body, "n") if endpoint in _USAGE_INJECTED else None
    previous = body.get("previous_response_id") if endpoint is Endpoint.RESPONSES else None
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        raw=raw,
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        client_wants_usage=bool(stream_options and stream_options.get("include_usage")),
        prompt_text=_prompt_text(endpoint, body),
        user=user if isinstance(user, str) and user else None,
        n=n,
        previous_response_id=previous,
    )


def _prompt_text(endpoint: Endpoint, body: dict[str, Any]) -> str:
    """The canonical prompt text for routing keys: chat-like bodies render their messages (the system
    prompt first, as a system message), the pooling bodies their texts in order."""
    surface = endpoint.surface
    if surface is ApiSurface.OPENAI and endpoint not in _POOLING_TEXTS:
        return canonical_prompt_text(body)
    if surface is ApiSurface.ANTHROPIC:
        system = body.get("system")
        head = [{"role": "system", "content": system}] if system else []
        return canonical_prompt_text({"messages": [*head, *body["messages"]]})
    if surface is ApiSurface.RESPONSES:
        value = body.get("input")
        instructions = body.get("instructions")
        head = [{"role": "system", "content": instructions}] if isinstance(instructions, str) else []
        if isinstance(value, str):
            return canonical_prompt_text({"messages": [*head, {"role": "user", "content": value}]})
        items = [i for i in value if isinstance(i, dict) and "role" in i] if isinstance(value, list) else []
        return canonical_prompt_text({"messages": [*head, *items]})
    texts = [body.get(name) for name in _POOLING_TEXTS[endpoint]]
    return canonical_prompt_text({"input": [t for t in texts if isinstance(t, str)] + _strings(texts)})


_POOLING_TEXTS = {
    Endpoint.RERANK: ("query", "documents"),
    Endpoint.RERANK_UNVERSIONED: ("query", "documents"),
    Endpoint.SCORE: ("text_1", "text_2"),
}


def _strings(values: list[Any]) -> list[str]:
    """The strings inside the list values of `values` (rerank documents, score text lists)."""
    return [item for value in values if isinstance(value, list) for item in value if isinstance(item, str)]


def parse_response_call(method: str, path: str, query: bytes, model: str) -> ParsedRequest:
    """A `/v1/responses/{id}[/cancel|/input_items]` call as a request of `model`'s pool (the pool that
    holds the id): no body, nothing to generate, sent to `path` (+ the query string) on the pinned
    replica."""
    upstream = path + ("?" + query.decode("latin-1") if query else "")
    return ParsedRequest(
        endpoint=Endpoint.RESPONSES,
        body={},
        raw=b"",
        model=model,
        stream=False,
        max_tokens=0,
        client_wants_usage=False,
        prompt_text="",
        user=None,
        method=method,
        path=upstream,
    )


def rewrite_body(parsed: ParsedRequest, upstream_model: str | None) -> bytes:
    """The bytes to send upstream: the original body unless a rewrite is needed (module docstring)."""
    if not parsed.raw:
        return parsed.raw  # a bodiless `/v1/responses/{id}` call
    needs_usage = parsed.stream and not parsed.client_wants_usage and parsed.endpoint in _USAGE_INJECTED
    if not needs_usage and (upstream_model is None or upstream_model == parsed.model):
        return parsed.raw
    body = dict(parsed.body)
    if upstream_model is not None:
        body["model"] = upstream_model
    if needs_usage:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(body)
