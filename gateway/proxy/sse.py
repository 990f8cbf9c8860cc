"""Server-sent events from an engine: split into events, classify each, forward the bytes unchanged.

An event is the bytes up to and including its blank-line terminator (`\\n\\n` or `\\r\\n\\r\\n`). We look
inside an event only to learn (a) whether it carries content (time to first token is measured at the
first content event, not the first byte: engines send an empty role chunk at once; what counts as
content is `core.first_token`, shared with the load generator), (b) usage, and
(c) whether it is the usage-only chunk (`choices: []`) that the gateway asked for on the client's behalf
and must strip again.

The Anthropic Messages and Responses streams (`gateway.base.surface`) are named events (`event: <type>`,
`data: {"type": <type>, ...}`); `inspect_named_event` reads them: content by `core.first_token`, usage
from `message_start`/`message_delta` (Anthropic: `input_tokens`, `output_tokens`) or `response.completed`
(Responses), normalised to the OpenAI names (`normalized_usage`); the end is `message_stop`, or
`response.completed` / `.failed` / `.incomplete`; an `error` event is the stream's error; the response id
comes from `response.created`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from core.first_token import anthropic_event_has_content, chunk_has_content, responses_event_has_content
from gateway.base.surface import ApiSurface

_TERMINATORS = (b"\n\n", b"\r\n\r\n")
DONE_EVENT = b"data: [DONE]\n\n"


class SSESplitter:
    """Incremental splitter: feed raw chunks, get back complete events (terminator included), each
    ended by the earliest terminator; a chunk without `\r\n\r\n` is split on `\n\n` alone (the same
    events: `\n\n` never occurs inside `\r\n\r\n`)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._buffer + chunk if self._buffer else chunk
        if b"\r\n\r\n" not in data:  # engines end events with `\n\n`: one split, no search per event
            *complete, self._buffer = data.split(b"\n\n")
            return [event + b"\n\n" for event in complete]
        events: list[bytes] = []
        start = 0
        while True:
            end, size = _next_terminator(data, start)
            if end < 0:
                break
            events.append(data[start : end + size])
            start = end + size
        self._buffer = data[start:]
        return events

    def remainder(self) -> bytes:
        """Bytes of an unterminated trailing event (the engine closed mid-event)."""
        return self._buffer


def _next_terminator(data: bytes, start: int) -> tuple[int, int]:
    best, size = -1, 0
    for term in _TERMINATORS:
        pos = data.find(term, start)
        if pos >= 0 and (best < 0 or pos < best):
            best, size = pos, len(term)
    return best, size


@dataclass(frozen=True, slots=True)
class EventInfo:
    has_content: bool
    usage: dict[str, Any] | None
    usage_only: bool
    is_done: bool
    error: bool
    response_id: str | None = None
    """The stored response's id (Responses API `response.created`)."""


_EMPTY = EventInfo(False, None, False, False, False)
_DONE = EventInfo(False, None, False, True, False)


def event_payload(event: bytes) -> bytes | None:
    """The `data:` payload of an event (multi-line data joined with newlines), or None."""
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def inspect_event(event: bytes, need_content: bool) -> EventInfo:
    """Classify one event. When `need_content` is False and the event mentions no usage, skip parsing."""
    if event.startswith(DONE_EVENT[:12]):
        return _DONE
    if not need_content and b'"usage"' not in event and b'"error"' not in event:
        return _EMPTY
    payload = event_payload(event)
    if payload is None:
        return _EMPTY
    if payload == b"[DONE]":
        return _DONE
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return _EMPTY
    if not isinstance(data, dict):
        return _EMPTY
    usage = data.get("usage")
    return EventInfo(
        has_content=chunk_has_content(data),
        usage=usage if isinstance(usage, dict) else None,
        usage_only=isinstance(usage, dict) and data.get("choices") == [],
        is_done=False,
        error="error" in data,
    )


RESPONSES_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
_ANTHROPIC_SKIP = b"content_block_delta"
_RESPONSES_SKIP = b'.delta"'


def normalized_usage(usage: Any) -> dict[str, Any] | None:
    """Usage with the OpenAI names (`prompt_tokens`, `completion_tokens`, `total_tokens` when both are
    known) from the Anthropic / Responses names (`input_tokens`, `output_tokens`); OpenAI usage as is."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        return usage
    out: dict[str, Any] = {}
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    if isinstance(prompt, int):
        out["prompt_tokens"] = prompt
    if isinstance(completion, int):
        out["completion_tokens"] = completion
    if isinstance(prompt, int) and isinstance(completion, int):
        out["total_tokens"] = prompt + completion
    return out or None


def merged_usage(before: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """`part` over `before` (a named stream's usage comes in parts: input, then output), the total
    recomputed when both counts are known."""
    if before is None:
        return part
    merged = {**before, **part}
    prompt, completion = merged.get("prompt_tokens"), merged.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        merged["total_tokens"] = prompt + completion
    return merged


def inspect_named_event(event: bytes, need_content: bool, surface: ApiSurface) -> EventInfo:
    """Classify one Anthropic or Responses stream event (module docstring). After the first content,
    the delta events (most of the stream) are not parsed."""
    skip = _ANTHROPIC_SKIP if surface is ApiSurface.ANTHROPIC else _RESPONSES_SKIP
    if not need_content and skip in event:
        return _EMPTY
    payload = event_payload(event)
    if payload is None:
        return _EMPTY
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return _EMPTY
    if not isinstance(data, dict):
        return _EMPTY
    kind = data.get("type")
    if surface is ApiSurface.ANTHROPIC:
        message = data.get("message")
        raw_usage = message.get("usage") if kind == "message_start" and isinstance(message, dict) else None
        if kind == "message_delta":
            raw_usage = data.get("usage")
        return EventInfo(
            has_content=anthropic_event_has_content(data),
            usage=normalized_usage(raw_usage),
            usage_only=False,
            is_done=kind == "message_stop",
            error=kind == "error",
        )
    response = data.get("response")
    response = response if isinstance(response, dict) else {}
    response_id = response.get("id") if kind == "response.created" else None
    return EventInfo(
        has_content=responses_event_has_content(data),
        usage=normalized_usage(response.get("usage")) if kind in RESPONSES_TERMINAL else None,
        usage_only=False,
        is_done=kind in RESPONSES_TERMINAL,
        error=kind == "error",
        response_id=response_id if isinstance(response_id, str) else None,
    )
