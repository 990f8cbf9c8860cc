"""Server-sent events from an engine: split into events, classify each, forward the bytes unchanged.

An event is the bytes up to and including its blank-line terminator (`\\n\\n` or `\\r\\n\\r\\n`). We look
inside an event only to learn (a) whether it carries content (time to first token is measured at the
first content event, not the first byte: engines send an empty role chunk at once; what counts as
content is `core.first_token`, shared with the load generator), (b) usage, and
(c) whether it is the usage-only chunk (`choices: []`) that the gateway asked for on the client's behalf
and must strip again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from core.first_token import chunk_has_content

_TERMINATORS = (b"\n\n", b"\r\n\r\n")
DONE_EVENT = b"data: [DONE]\n\n"


class SSESplitter:
    """Incremental splitter: feed raw chunks, get back complete events (terminator included)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._buffer + chunk if self._buffer else chunk
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
