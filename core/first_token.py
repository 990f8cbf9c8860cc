"""What counts as the first token of a stream: the one definition of "this chunk has content".

Time to first token is measured at the first streamed chunk *with content*, not at the first byte:
engines send an empty role chunk (`delta: {"role": "assistant", "content": ""}`) at once, and a final
usage-only chunk (`choices: []`). The gateway (`gateway/proxy/sse.py`) and the load generator
(`bench/client.py`, `bench/rawsse.py`) both decide with the functions below, so the TTFT a benchmark
reports is the TTFT the gateway measures and exports.

A choice (one element of a decoded chunk's `choices`) has content when any of these is non-empty:

- `text` — a completions (`/v1/completions`) chunk's text;
- `delta.content` — a chat chunk's text;
- `delta.reasoning_content` or `delta.reasoning` — reasoning text (vLLM and SGLang reasoning parsers;
  vLLM's newer field is `reasoning`), which a reasoning model streams before any `content`;
- `delta.tool_calls` — a tool-call delta (a list; its first element names the function);
- `delta.function_call` — the legacy function-call delta.

Nothing else counts: not a role, not `finish_reason`, not `logprobs`, not `usage`. "Non-empty" is
Python truthiness: `""`, `[]`, `{}` and `None` are empty. Pure functions of decoded JSON, stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DELTA_CONTENT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")
"""The `delta` fields of a chat chunk any one of which, when non-empty, makes the chunk content."""


def choice_has_content(choice: Any) -> bool:
    """True when one decoded choice of a streamed chunk (chat or completions) carries content."""
    if not isinstance(choice, Mapping):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, Mapping):
        return False
    return any(delta.get(name) for name in DELTA_CONTENT_FIELDS)


def chunk_has_content(chunk: Any) -> bool:
    """True when any choice of one decoded streamed chunk carries content (see `choice_has_content`)."""
    if not isinstance(chunk, Mapping):
        return False
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(choice_has_content(c) for c in choices)


ANTHROPIC_DELTA_FIELDS = ("text", "thinking", "partial_json")
"""The `delta` fields of an Anthropic `content_block_delta` event (`text_delta`, `thinking_delta`,
`input_json_delta` — a tool call's arguments) any one of which, when non-empty, makes it content."""


def anthropic_event_has_content(event: Any) -> bool:
    """True when one decoded Anthropic Messages stream event carries content: a `content_block_delta`
    whose delta has a non-empty text, thinking or tool-input fragment. Not `message_start`, not a
    block's start or stop, not `message_delta` (stop reason and usage), not `ping`."""
    if not isinstance(event, Mapping) or event.get("type") != "content_block_delta":
        return False
    delta = event.get("delta")
    return isinstance(delta, Mapping) and any(delta.get(name) for name in ANTHROPIC_DELTA_FIELDS)


def responses_event_has_content(event: Any) -> bool:
    """True when one decoded Responses API stream event carries content: any `response.….delta` event
    with a non-empty `delta` — output text, reasoning text and summaries, refusals, function-call and
    other tool-call arguments (the same kinds as chat's definition above). Not `response.created`, not
    an item's or part's added/done events, not `response.completed`."""
    if not isinstance(event, Mapping):
        return False
    kind = event.get("type")
    return (
        isinstance(kind, str)
        and kind.startswith("response.")
        and kind.endswith(".delta")
        and bool(event.get("delta"))
    )
