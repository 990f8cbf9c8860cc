"""Mid-stream continuation: a stream whose replica breaks after the first byte goes on from another
replica, over plain OpenAI HTTP, instead of ending with a terminal error.

What the client has received is kept (`StreamTranscript`); when the stream breaks (idle timeout,
reset, truncation, a resumed try's missed first token), the serve loop sends the original request to
another replica with the text generated so far appended (`continuation_body`):

- chat: a final `{"role": "assistant", "content": <text so far>}` message, `continue_final_message:
  true`, `add_generation_prompt: false` (vLLM's and SGLang's parameters; llama.cpp continues a trailing
  assistant message by itself);
- completions: `prompt` + the text so far (a string prompt only);
- `max_tokens` / `max_completion_tokens` reduced by the content chunks already sent; usage asked for.

The new stream is spliced into the client's (`Splice`): its chunks get the first stream's `id`,
`created` and `model`, its role chunk is dropped (no second role), and its usage chunk reports one total
for the request: completion_tokens = chunks sent before the break + the new stream's completion tokens,
prompt_tokens = the new stream's prompt tokens − the chunks sent before (the text so far was in its
prompt). At most `continuation.max_resumes` per request. A continuation is owed, not retried: it moves
a stream the pool already admitted to another replica, so it neither draws from nor counts against the
retry budget (`llm_gateway_stream_continuations_total`, not `llm_gateway_retries_total`); what bounds
the pool's continuations is what was running on the replica that broke, each stream `max_resumes` times.

Exact and not: the client gets every chunk once and in order, and the text continues where it stopped.
The engine re-tokenises the seam: the text so far becomes prompt tokens that may not split exactly as
the generated tokens did, so the continuation can differ from what the broken replica would have said
next (sampling differs anyway unless the request has a `seed`), and the token counts above take one
content chunk as one token (true for vLLM, SGLang and llama.cpp streaming; not for engines that batch
tokens into chunks). Not resumable (the break ends with the terminal error as before): more than one
choice (`n` > 1), tool-call, function-call or reasoning deltas, a non-string completions prompt, an
output budget already spent, or a stream whose recorded text was over `MAX_TRANSCRIPT_BYTES`.

Cost: nothing is parsed while the stream is healthy; the forwarded bytes are kept and folded into text
every `FOLD_BYTES` (so a long stream costs one JSON parse per event, a short one nothing unless it breaks).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.body_limits import integral_value
from gateway.api.request_parsing import Endpoint, ParsedRequest
from gateway.proxy.sse import DONE_EVENT, SSESplitter, event_payload

FOLD_BYTES = 64 * 1024
MAX_TRANSCRIPT_BYTES = 4 * 1024 * 1024
_NOT_RESUMABLE_DELTAS = ("tool_calls", "function_call", "reasoning_content", "reasoning")


def _json_payload(event: bytes) -> dict[str, Any] | None:
    payload = event_payload(event)
    if payload is None:
        return None
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


class StreamTranscript:
    """What the client has received of one stream: the first chunk's identity and the generated text."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._splitter = SSESplitter()
        self._parts: list[str] = []
        self._text_bytes = 0
        self._content_chunks = 0
        self._identity: dict[str, Any] | None = None
        self._resumable = True

    @property
    def content_chunks(self) -> int:
        """Content chunks the client received (one token each, see the module docstring)."""
        self._fold()
        return self._content_chunks

    @property
    def identity(self) -> dict[str, Any] | None:
        """The first chunk's `id`, `created` and `model`, as the client saw them."""
        self._fold()
        return self._identity

    @property
    def resumable(self) -> bool:
        """False once something was received that a continuation cannot reproduce (module docstring)."""
        self._fold()
        return self._resumable

    def record(self, data: bytes) -> None:
        """Keep bytes just sent to the client (folded into text every `FOLD_BYTES`)."""
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= FOLD_BYTES:
            self._fold()

    def text(self) -> str:
        """The text the client has received so far (folds what is pending)."""
        self._fold()
        return "".join(self._parts)

    def _fold(self) -> None:
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        for data in pending:
            for event in self._splitter.feed(data):
                self._take(event)

    def _take(self, event: bytes) -> None:
        data = _json_payload(event)
        if data is None:
            return
        if self._identity is None and "id" in data:
            self._identity = {key: data[key] for key in ("id", "created", "model") if key in data}
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        if len(choices) > 1 or not isinstance(choices[0], dict):
            self._resumable = False
            return
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(delta.get(name) for name in _NOT_RESUMABLE_DELTAS):
                self._resumable = False
            text = delta.get("content")
        else:
            text = choice.get("text")
        if isinstance(text, str) and text:
            self._parts.append(text)
            self._text_bytes += len(text)
            self._content_chunks += 1
            if self._text_bytes > MAX_TRANSCRIPT_BYTES:
                self._resumable = False


def continuation_body(
    parsed: ParsedRequest, transcript: StreamTranscript, upstream_model: str | None
) -> bytes | None:
    """The request that continues `parsed` after `transcript` (module docstring), or None when the
    stream cannot be continued."""
    text = transcript.text()
    if not transcript.resumable or not text or parsed.n not in (None, 1):
        return None
    body = dict(parsed.body)
    for name in ("max_completion_tokens", "max_tokens"):
        budget = integral_value(body.get(name))  # `4.0` is 4 (`gateway.api.body_limits`)
        if budget is not None:
            left = budget - transcript.content_chunks
            if left <= 0:
                return None
            body[name] = left
    if parsed.endpoint is Endpoint.CHAT:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    elif parsed.endpoint is Endpoint.COMPLETIONS and isinstance(body.get("prompt"), str):
        body["prompt"] = body["prompt"] + text
    else:
        return None
    if upstream_model is not None:
        body["model"] = upstream_model
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(body)


class Splice:
    """Rewrites a continuation's events into the client's stream (module docstring)."""

    def __init__(self, transcript: StreamTranscript) -> None:
        self._identity = transcript.identity or {}
        self._sent_chunks = transcript.content_chunks

    def rewrite(self, event: bytes) -> bytes | None:
        """The event as the client should see it, or None to drop it (the continuation's role chunk)."""
        if event.startswith(DONE_EVENT[:12]):
            return event
        data = _json_payload(event)
        if data is None:
            return event
        choices = data.get("choices")
        if isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
            delta = choices[0].get("delta")
            if (
                isinstance(delta, dict)
                and "role" in delta
                and not delta.get("content")
                and not choices[0].get("finish_reason")
            ):
                return None
        usage = data.get("usage")
        if isinstance(usage, dict):
            data["usage"] = self._total_usage(usage)
        data.update(self._identity)
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def _total_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return usage
        prompt = max(0, prompt - self._sent_chunks)
        completion += self._sent_chunks
        return {
            **usage,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
