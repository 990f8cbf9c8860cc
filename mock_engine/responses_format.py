"""The OpenAI Responses API format of the mock engine: the request's conversation, the response object
and the streamed events (vLLM-shaped; the store and routes are `responses_store.py`).

Request: `input` (a string: one user message; or an array of message items `{role, content}`, content a
string or parts whose `text` is read; items without a role are skipped), optional `instructions` (a
system message for this turn), `max_output_tokens` (≥ 1), `previous_response_id`, `stream`, `store`
(default true). The text is the chat generation of the whole conversation: the previous response's
conversation and its output as an assistant message, then this input.

The response object: `{"id": "resp_…", "object": "response", "created_at", "model", "status", "output":
[one assistant message with one `output_text` part], "usage": {"input_tokens", "output_tokens",
"total_tokens", …}, "previous_response_id", "incomplete_details", …}`; `status` is `incomplete` (reason
`max_output_tokens`) when `max_output_tokens` ran out, else `completed`, as vLLM.

Streamed (SSE, `event: <type>` + `data: {"type", "sequence_number", …}`): `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`, one
`response.output_text.delta` per token, `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, then `response.completed` (or `response.incomplete`) with the full object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from mock_engine.generation import Generation
from mock_engine.validation import RequestError

Message = dict[str, Any]


def input_messages(body: dict[str, Any]) -> list[Message]:
    """This turn's input as chat messages (module docstring); raises `RequestError` when malformed."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise RequestError("input must be a string or an array of items", "input")
    out: list[Message] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise RequestError(f"input[{i}] must be an object", "input")
        if "role" not in item:
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if not isinstance(item["role"], str) or not isinstance(content, str | None):
            raise RequestError(f"input[{i}] must have a string role and string or part content", "input")
        out.append({"role": item["role"], "content": content or ""})
    return out


def generation(body: dict[str, Any], conversation: list[Message], default_max_tokens: int) -> Generation:
    """The chat generation of `conversation` (instructions first), `max_output_tokens` its length."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string", "instructions")
    head = [{"role": "system", "content": instructions}] if instructions else []
    chat = {
        "messages": head + conversation,
        "max_tokens": body.get("max_output_tokens"),
        "stream": body.get("stream"),
    }
    try:
        return Generation.from_body(chat, True, default_max_tokens)
    except RequestError as exc:
        if exc.param == "max_tokens":
            raise RequestError(
                str(exc).replace("max_tokens", "max_output_tokens"), "max_output_tokens"
            ) from None
        raise


def response_object(
    response_id: str, model: str, gen: Generation, body: dict[str, Any], *, text: str | None, emitted: int
) -> dict[str, Any]:
    """The response object; `text` None while it is in progress."""
    done = text is not None
    incomplete = done and gen.finish_reason == "length"
    status = "in_progress" if not done else "incomplete" if incomplete else "completed"
    output: list[dict[str, Any]] = []
    if done:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        output.append(
            {
                "type": "message",
                "id": "msg_" + gen.request_id,
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    usage = {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": emitted,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": gen.prompt_tokens + emitted,
    }
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": output,
        "usage": usage if done else None,
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "text": {"format": {"type": "text"}},
        "store": body.get("store") is not False,
        "background": False,
    }


class ResponsesWire:
    """The Responses format of one generation (`streaming.Wire`); `on_done(object, text)` runs once the
    response is complete (the store keeps it)."""

    def __init__(
        self,
        response_id: str,
        model: str,
        gen: Generation,
        body: dict[str, Any],
        on_done: Callable[[dict[str, Any], str], None],
    ) -> None:
        self.response_id, self.model, self.gen, self.body = response_id, model, gen, body
        self._on_done = on_done
        self._sequence = 0
        self._parts: list[str] = []
        self._item_id = "msg_" + gen.request_id

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _object(self, text: str | None, emitted: int) -> dict[str, Any]:
        return response_object(self.response_id, self.model, self.gen, self.body, text=text, emitted=emitted)

    def head(self) -> bytes:
        started = self._object(None, 0)
        item = {
            "type": "message",
            "id": self._item_id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return (
            self._event("response.created", {"response": started})
            + self._event("response.in_progress", {"response": started})
            + self._event("response.output_item.added", {"output_index": 0, "item": item})
            + self._event("response.content_part.added", {**where, "part": part})
        )

    def token(self, text: str) -> bytes:
        self._parts.append(text)
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return self._event("response.output_text.delta", {**where, "delta": text, "logprobs": []})

    def tail(self, emitted: int) -> bytes:
        text = "".join(self._parts)
        final = self._object(text, emitted)
        self._on_done(final, text)
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        part = final["output"][0]["content"][0]
        terminal = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return (
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            + self._event("response.content_part.done", {**where, "part": part})
            + self._event("response.output_item.done", {"output_index": 0, "item": final["output"][0]})
            + self._event(terminal, {"response": final})
        )

    def full(self, text: str, emitted: int) -> bytes:
        final = self._object(text, emitted)
        self._on_done(final, text)
        return orjson.dumps(final)
