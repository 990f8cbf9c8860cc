"""OpenAI wire format for the mock engine: response objects and SSE chunks (vLLM-shaped)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from mock_engine.generation import Generation


def chunk_event(
    request_id: str, model: str, chat: bool, text: str | None, finish_reason: str | None
) -> bytes:
    """One streamed chunk; `text=None` with chat is the initial role chunk."""
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    body = {"id": request_id, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def usage_counts(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def usage_event(request_id: str, model: str, chat: bool, prompt_tokens: int, completion_tokens: int) -> bytes:
    obj = "chat.completion.chunk" if chat else "text_completion"
    body = {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage_counts(prompt_tokens, completion_tokens),
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def full_response(
    request_id: str,
    model: str,
    chat: bool,
    text: str,
    finish_reason: str,
    *,
    usage: tuple[int, int],
    extra: dict[str, Any] | None = None,
) -> bytes:
    """A non-streamed completion; `usage` is (prompt_tokens, completion_tokens); `extra` top-level fields
    (a vLLM prefill leg's `kv_transfer_params`)."""
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    body = {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_counts(*usage),
    }
    if extra:
        body.update(extra)
    return orjson.dumps(body)


def error_body(message: str, status: int, kind: str = "mock_engine_error", param: str | None = None) -> bytes:
    """An OpenAI-style error object; `param` names the offending field when there is one."""
    error: dict[str, Any] = {"message": message, "type": kind, "code": status}
    if param:
        error["param"] = param
    return orjson.dumps({"error": error})


def bad_request_body(message: str, param: str | None = None) -> bytes:
    """vLLM's answer to invalid input (400): `param` names the offending field, null when none does."""
    error = {"message": message, "type": "BadRequestError", "param": param, "code": 400}
    return orjson.dumps({"error": error})


class OpenAIWire:
    """The OpenAI chat/completions format of one generation (`streaming.Wire`)."""

    def __init__(
        self, response_id: str, model: str, gen: Generation, extra: dict[str, Any] | None = None
    ) -> None:
        self.response_id, self.model, self.gen, self.extra = response_id, model, gen, extra

    def head(self) -> bytes:
        """Chat streams send the empty role chunk at once, as vLLM does."""
        return chunk_event(self.response_id, self.model, True, None, None) if self.gen.chat else b""

    def token(self, text: str) -> bytes:
        return chunk_event(self.response_id, self.model, self.gen.chat, text, None)

    def tail(self, emitted: int) -> bytes:
        gen = self.gen
        tail = chunk_event(self.response_id, self.model, gen.chat, "", gen.finish_reason)
        if gen.include_usage:
            tail += usage_event(self.response_id, self.model, gen.chat, gen.prompt_tokens, emitted)
        return tail + b"data: [DONE]\n\n"

    def full(self, text: str, emitted: int) -> bytes:
        gen = self.gen
        usage = (gen.prompt_tokens, emitted)
        return full_response(
            self.response_id, self.model, gen.chat, text, gen.finish_reason, usage=usage, extra=self.extra
        )
