"""Which API family a proxied endpoint belongs to: it fixes how errors are rendered and how a stream's
events are read (first output, usage, end), never which errors exist (`gateway.base.errors` is the one
hierarchy, `gateway.base.error_mapping` its one mapping).

- `openai`: chat/completions/embeddings/tokenize and the pooling endpoints. Error body
  `{"error": {"message", "type", "code"}}`; streams of `data: <chunk>` ending in `data: [DONE]`.
- `anthropic`: `/v1/messages` and its `count_tokens`. Error body
  `{"type": "error", "error": {"type", "message"}}`; streams of named events (`message_start` …
  `message_stop`), a terminal `event: error`.
- `responses`: the OpenAI Responses API. Errors before the start as `openai`; streams of named
  `response.*` events ending in `response.completed` (or `.failed` / `.incomplete`), a terminal
  `event: error` whose data is `{"type": "error", "code", "message", "param"}`.
"""

from __future__ import annotations

from enum import StrEnum


class ApiSurface(StrEnum):
    """The API family of an endpoint (module docstring)."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"
