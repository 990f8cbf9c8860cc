"""The mock engine's HTTP server: OpenAI-compatible endpoints over an `EngineCore` (plain ASGI).

Endpoints: POST /v1/chat/completions, /v1/completions, /v1/embeddings, /tokenize, /detokenize;
GET /v1/models, /health, /metrics (vLLM names), /mock/stats (counters tests read); POST /mock/faults.
Streams send the role chunk at once (as vLLM does), one chunk per token, a finish chunk, the usage chunk
when `stream_options.include_usage` is set, then `[DONE]`. A client that disconnects aborts its request
in the core (counted in `aborted`), so the simulated GPU stops working on it.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from mock_engine import openai_format as fmt
from mock_engine.core import EngineCore, TokenEvent
from mock_engine.driver import EngineDriver
from mock_engine.faults import FaultInjector, FaultSettings
from mock_engine.metrics_text import render_metrics
from mock_engine.text import estimate_tokens, prompt_seed, token_text

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

EMBEDDING_DIM = 8


@dataclass(slots=True)
class RequestCounters:
    """What tests read from GET /mock/stats."""

    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed_injected: int = 0
    active: int = 0
    max_active: int = 0


@dataclass(frozen=True, slots=True)
class MockEngineConfig:
    model: str = "mock-model"
    default_max_tokens: int = 64
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class _Generation:
    """One generation request in flight on this engine."""

    request_id: str
    response_id: str
    chat: bool
    seed: int
    prompt_tokens: int
    finish_reason: str
    include_usage: bool
    queue: asyncio.Queue[TokenEvent] | None


class _Stop(Exception):
    """Client went away."""


class MockEngineApp:
    def __init__(
        self, config: MockEngineConfig, core: EngineCore, faults: FaultSettings, seed: int = 0
    ) -> None:
        self.config = config
        self.driver = EngineDriver(core, speed=config.speed)
        self.faults = FaultInjector(faults, random.Random(seed))
        self.counters = RequestCounters()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = (scope["method"], scope["path"])
        handler = {
            ("POST", "/v1/chat/completions"): self._generate,
            ("POST", "/v1/completions"): self._generate,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
            ("POST", "/mock/faults"): self._set_faults,
        }.get(route)
        if handler is not None:
            await handler(scope, receive, send)
            return
        simple: dict[tuple[str, str], Callable[[], tuple[bytes, str]]] = {
            ("GET", "/health"): lambda: (b"{}", "application/json"),
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): lambda: (
                render_metrics(self.config.model, self.driver.core.stats()),
                "text/plain",
            ),
            ("GET", "/mock/stats"): lambda: (orjson.dumps(asdict(self.counters)), "application/json"),
        }
        answer = simple.get(route)
        if answer is None:
            await _respond(send, 404, fmt.error_body(f"no route {route[0]} {route[1]}", 404))
            return
        body, content_type = answer()
        await _respond(send, 200, body, content_type)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.driver.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.driver.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _models(self) -> tuple[bytes, str]:
        data = [{"id": self.config.model, "object": "model", "owned_by": "mock-engine"}]
        return orjson.dumps({"object": "list", "data": data}), "application/json"

    async def _set_faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            changes = orjson.loads(await _read_body(receive))
            self.faults.settings = self.faults.settings.updated(changes)
        except (ValueError, TypeError) as exc:
            await _respond(send, 400, fmt.error_body(str(exc), 400))
            return
        await _respond(send, 200, orjson.dumps(self.faults.settings.as_dict()))

    async def _parse(self, receive: Receive, send: Send) -> dict[str, Any] | None:
        try:
            body = orjson.loads(await _read_body(receive))
            if not isinstance(body, dict):
                raise ValueError("body must be an object")
        except (ValueError, _Stop) as exc:
            await _respond(send, 400, fmt.error_body(f"bad request: {exc}", 400))
            return None
        if self.faults.should_fail():
            self.counters.failed_injected += 1
            status = self.faults.settings.error_status
            headers = []
            if self.faults.settings.retry_after_s is not None:
                headers.append((b"retry-after", str(int(self.faults.settings.retry_after_s)).encode()))
            await _respond(send, status, fmt.error_body("injected fault", status), extra=headers)
            return None
        return body

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._parse(receive, send)
        if body is None:
            return
        gen = self._start_generation(body, chat=scope["path"] == "/v1/chat/completions")
        c = self.counters
        c.started += 1
        c.active += 1
        c.max_active = max(c.max_active, c.active)
        watcher = asyncio.create_task(_wait_disconnect(receive))
        try:
            if body.get("stream"):
                await self._stream(send, gen, watcher)
            else:
                text, n = await _collect(gen, watcher)
                await _respond(
                    send,
                    200,
                    fmt.full_response(
                        gen.response_id,
                        self.config.model,
                        gen.chat,
                        text,
                        gen.finish_reason,
                        usage=(gen.prompt_tokens, n),
                    ),
                )
            c.finished += 1
        except _Stop:
            c.aborted += 1
            self.driver.abort(gen.request_id)
        finally:
            watcher.cancel()
            c.active -= 1
            self.driver.finish(gen.request_id)

    def _start_generation(self, body: dict[str, Any], chat: bool) -> _Generation:
        prompt = _prompt_of(body, chat)
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = int(requested) if requested else self.config.default_max_tokens
        request_id = uuid.uuid4().hex
        prompt_tokens = estimate_tokens(prompt)
        queue = self.driver.submit(request_id, prompt, prompt_tokens, max_tokens) if max_tokens > 0 else None
        options = body.get("stream_options") or {}
        return _Generation(
            request_id=request_id,
            response_id=("chatcmpl-" if chat else "cmpl-") + request_id,
            chat=chat,
            seed=prompt_seed(prompt),
            prompt_tokens=prompt_tokens,
            finish_reason="length" if requested else "stop",
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            queue=queue,
        )

    async def _stream(self, send: Send, gen: _Generation, watcher: asyncio.Task[None]) -> None:
        model, rid, chat = self.config.model, gen.response_id, gen.chat
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if chat:
            await _send_body(send, fmt.chunk_event(rid, model, chat, None, None))
        emitted = 0
        while gen.queue is not None:
            event = await _next_event(gen.queue, watcher)
            await _send_body(send, fmt.chunk_event(rid, model, chat, token_text(gen.seed, event.index), None))
            emitted += 1
            if event.finished:
                break
        tail = fmt.chunk_event(rid, model, chat, "", gen.finish_reason)
        if gen.include_usage:
            tail += fmt.usage_event(rid, model, chat, gen.prompt_tokens, emitted)
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._parse(receive, send)
        if body is None:
            return
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else [str(x) for x in raw] if isinstance(raw, list) else [""]
        data = []
        for i, text in enumerate(inputs):
            seed = prompt_seed(text)
            vector = [((seed >> (4 * k)) & 0xF) / 15.0 for k in range(EMBEDDING_DIM)]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(estimate_tokens(t) for t in inputs)
        out = {
            "object": "list",
            "data": data,
            "model": self.config.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        await _respond(send, 200, orjson.dumps(out))

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._parse(receive, send)
        if body is not None:
            text = str(body.get("prompt", ""))
            tokens = [ord(ch) for ch in text[::4]]
            await _respond(
                send, 200, orjson.dumps({"tokens": tokens, "count": len(tokens), "max_model_len": 8192})
            )

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._parse(receive, send)
        if body is not None:
            tokens = body.get("tokens") or []
            await _respond(send, 200, orjson.dumps({"prompt": "".join(chr(int(t)) for t in tokens)}))


def _prompt_of(body: dict[str, Any], chat: bool) -> str:
    if chat:
        messages = body.get("messages") or []
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else "".join(str(p) for p in prompt)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _next_event(queue: asyncio.Queue[TokenEvent], watcher: asyncio.Task[None]) -> TokenEvent:
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    raise _Stop


async def _collect(gen: _Generation, watcher: asyncio.Task[None]) -> tuple[str, int]:
    parts: list[str] = []
    while gen.queue is not None:
        event = await _next_event(gen.queue, watcher)
        parts.append(token_text(gen.seed, event.index))
        if event.finished:
            break
    return "".join(parts), len(parts)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Stop
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_body(send: Send, body: bytes) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": True})


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body, "more_body": False})
