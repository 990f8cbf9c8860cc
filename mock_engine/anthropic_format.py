"""The Anthropic Messages API of the mock engine (`POST /v1/messages`, `/v1/messages/count_tokens`), as
vLLM serves it: the same generation as chat, in Anthropic's format.

Request: `max_tokens` (required, ≥ 1), `messages` (`role`, `content` a string or content blocks whose
`text` is read), optional `system` (a string or text blocks) and `stream`. The text is the chat
generation of the messages with the system prompt as a first system message, so it equals the chat
answer to the same conversation. `stop_reason`: `max_tokens` when `max_tokens` ran out, else `end_turn`.

Non-streamed: `{"id": "msg_…", "type": "message", "role": "assistant", "model", "content": [{"type":
"text", "text"}], "stop_reason", "stop_sequence": null, "usage": {"input_tokens", "output_tokens"}}`.
Streamed (SSE, each event `event: <type>` + `data: {"type": <type>, …}`): `message_start` (the message
with empty content, usage with the input tokens), `content_block_start`, `ping`, one
`content_block_delta` (`text_delta`) per token, `content_block_stop`, `message_delta` (stop reason,
usage with the output tokens), `message_stop`. `count_tokens` answers `{"input_tokens"}`.

Bad input is a 400 in Anthropic's shape, `{"type": "error", "error": {"type": "invalid_request_error",
"message"}}`; a `model` the engine does not serve (`served_models.py`) a 404 in that shape as vLLM
translates its error, `{"type": "error", "error": {"type": "NotFoundError", "message": "The model `x`
does not exist."}}`; an injected fault's error keeps the mock's OpenAI shape (faults.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from mock_engine.asgi import ClientGone, Receive, Scope, Send, read_body, respond
from mock_engine.generation import Generation
from mock_engine.served_models import UnknownModel
from mock_engine.validation import RequestError

if TYPE_CHECKING:
    from mock_engine.server import MockEngineApp

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


def error_body(message: str, kind: str = "invalid_request_error") -> bytes:
    """An Anthropic-style error object."""
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _system_text(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list) and all(
        isinstance(b, dict) and isinstance(b.get("text", ""), str) for b in system
    ):
        return "".join(str(block.get("text", "")) for block in system)
    raise RequestError("system must be a string or an array of text blocks", "system")


def messages_generation(
    body: dict[str, Any], default_max_tokens: int, *, counting: bool = False
) -> Generation:
    """The chat generation of a Messages body (module docstring); `counting` (count_tokens) does not
    need `max_tokens`. Raises `RequestError` for an invalid body."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", "model")
    max_tokens = body.get("max_tokens")
    if not counting and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError("max_tokens: a positive integer is required", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: a non-empty array is required", "messages")
    system = _system_text(body.get("system"))
    chat = {
        "messages": ([{"role": "system", "content": system}] if system else []) + messages,
        "max_tokens": max_tokens if not counting else 1,
        "stream": body.get("stream"),
    }
    return Generation.from_body(chat, True, default_max_tokens)


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class AnthropicWire:
    """The Messages format of one generation (`streaming.Wire`)."""

    def __init__(self, gen: Generation, model: str) -> None:
        self.gen, self.model = gen, model
        self.message_id = "msg_" + gen.request_id

    def _message(
        self, content: list[dict[str, Any]], stop_reason: str | None, output_tokens: int
    ) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": self.gen.prompt_tokens, "output_tokens": output_tokens},
        }

    def head(self) -> bytes:
        return (
            _event("message_start", {"message": self._message([], None, 0)})
            + _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            + _event("ping", {})
        )

    def token(self, text: str) -> bytes:
        return _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})

    def tail(self, emitted: int) -> bytes:
        stop = {"stop_reason": STOP_REASONS[self.gen.finish_reason], "stop_sequence": None}
        return (
            _event("content_block_stop", {"index": 0})
            + _event("message_delta", {"delta": stop, "usage": {"output_tokens": emitted}})
            + _event("message_stop", {})
        )

    def full(self, text: str, emitted: int) -> bytes:
        content = [{"type": "text", "text": text}]
        return orjson.dumps(self._message(content, STOP_REASONS[self.gen.finish_reason], emitted))


def anthropic_routes(app: MockEngineApp) -> dict[tuple[str, str], Any]:
    """The server's routes for the Messages API."""

    async def body_of(receive: Receive, send: Send) -> dict[str, Any] | None:
        try:
            body = orjson.loads(await read_body(receive))
        except ClientGone:
            return None
        except orjson.JSONDecodeError as exc:
            await respond(send, 400, error_body(f"the body is not valid JSON: {exc}"))
            return None
        if not isinstance(body, dict):
            await respond(send, 400, error_body("the body must be a JSON object"))
            return None
        return body

    async def messages(scope: Scope, receive: Receive, send: Send) -> None:
        body = await body_of(receive, send)
        if body is None:
            return
        try:
            gen = messages_generation(body, app.config.default_max_tokens)
            gen = dataclasses.replace(gen, adapter=app.models.resolve(body.get("model")))
        except RequestError as exc:
            await respond(send, 400, error_body(str(exc)))
            return
        except UnknownModel as exc:
            await respond(send, 404, error_body(str(exc), "NotFoundError"))
            return
        too_long = app.over_context(gen)
        if too_long is not None:
            await respond(send, 400, error_body(too_long))
            return
        plan = await app.fault_plan(send, gen.prompt)
        if plan is not None:
            wire = AnthropicWire(gen, app.models.answer_name(gen.adapter))
            await app.runner.run(gen, plan, receive, send, stream=bool(body.get("stream")), wire=wire)

    async def count_tokens(scope: Scope, receive: Receive, send: Send) -> None:
        body = await body_of(receive, send)
        if body is None:
            return
        try:
            gen = messages_generation(body, app.config.default_max_tokens, counting=True)
            app.models.resolve(body.get("model"))
        except RequestError as exc:
            await respond(send, 400, error_body(str(exc)))
            return
        except UnknownModel as exc:
            await respond(send, 404, error_body(str(exc), "NotFoundError"))
            return
        await respond(send, 200, orjson.dumps({"input_tokens": gen.prompt_tokens}))

    return {("POST", MESSAGES_PATH): messages, ("POST", COUNT_TOKENS_PATH): count_tokens}
