"""One generation request: OpenAI streamed (SSE) and non-streamed answers with its fault plan applied.

Streams send the 200 headers and (chat) the role chunk at once, as vLLM does, then one chunk per token, a
finish chunk, the usage chunk when `stream_options.include_usage` is set, and `[DONE]`. The bytes are a
`Wire`'s: `openai_format.OpenAIWire` by default; the Anthropic Messages and Responses formats have theirs
(`anthropic_format.py`, `responses_format.py`), over the same generation and faults. The plan's faults
(see `faults.py`) act here: an extra wait before the request reaches the engine (slow first token), a
seeded pause before each token (jitter), and after N tokens either silence until the client leaves (stall)
or a TCP reset (crash). A client that disconnects raises `ClientGone`; the server then aborts the request in
the engine so the simulated GPU stops working on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mock_engine import openai_format as fmt
from mock_engine.asgi import ClientGone, InjectedCrash, Receive, Send, reset_connection, respond, send_body
from mock_engine.core import TokenEvent
from mock_engine.driver import EngineDriver
from mock_engine.faults import FaultPlan, Interruption
from mock_engine.generation import Generation

Outcome = Literal["finished", "crashed"]
STALL_POLL_S = 0.1
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class Wire(Protocol):
    """The bytes of one request's answer in its API format."""

    def head(self) -> bytes:
        """Events sent with the stream's 200 headers, before any token (may be empty)."""
        ...

    def token(self, text: str) -> bytes:
        """The event carrying one generated token."""
        ...

    def tail(self, emitted: int) -> bytes:
        """The stream's last events, after `emitted` tokens (finish, usage, end marker)."""
        ...

    def full(self, text: str, emitted: int) -> bytes:
        """The non-streamed answer (`text` in `emitted` tokens)."""
        ...


@dataclass(slots=True)
class RequestCounters:
    """What tests read from GET /mock/stats. At any time:
    `started == finished + aborted + crashed_injected + active` (injected errors never start)."""

    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed_injected: int = 0
    active: int = 0
    max_active: int = 0
    slowed_injected: int = 0
    stalled_injected: int = 0
    crashed_injected: int = 0
    poisoned_injected: int = 0


class GenerationRun:
    """Runs one `Generation` on the engine with its `FaultPlan`, answering through ASGI `send`."""

    def __init__(
        self,
        driver: EngineDriver,
        gen: Generation,
        plan: FaultPlan,
        *,
        model: str,
        counters: RequestCounters,
        receive: Receive,
        watcher: asyncio.Task[None],
        shutting_down: Callable[[], bool],
        answer_fields: dict[str, Any] | None = None,
        wire: Wire | None = None,
    ) -> None:
        """`answer_fields`: extra top-level fields of the non-streamed answer (OpenAI wire); `wire`: the
        answer's format (default `OpenAIWire`)."""
        self.driver, self.gen, self.plan, self.model = driver, gen, plan, model
        self.wire: Wire = wire or fmt.OpenAIWire(gen.response_id, model, gen, answer_fields)
        self.counters = counters
        self._receive, self._watcher, self._shutting_down = receive, watcher, shutting_down

    async def stream(self, send: Send) -> Outcome:
        wire = self.wire
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        head = wire.head()
        if head:
            await send_body(send, head)

        async def emit(text: str) -> None:
            await send_body(send, wire.token(text))

        emitted, fault = await self._tokens(emit)
        if fault is not None:
            return await self._interrupt(fault)
        await send({"type": "http.response.body", "body": wire.tail(emitted), "more_body": False})
        return "finished"

    async def complete(self, send: Send) -> Outcome:
        parts: list[str] = []

        async def collect(text: str) -> None:
            parts.append(text)

        emitted, fault = await self._tokens(collect)
        if fault is not None:
            return await self._interrupt(fault)
        await respond(send, 200, self.wire.full("".join(parts), emitted))
        return "finished"

    async def _tokens(self, emit: Callable[[str], Awaitable[None]]) -> tuple[int, Interruption | None]:
        """Emit tokens until the end or the plan's interruption; returns (tokens emitted, interruption)."""
        plan, gen = self.plan, self.gen
        if plan.first_token_delay_s > 0:
            self.counters.slowed_injected += 1
            await _pause(plan.first_token_delay_s, self._watcher)
        queue = None
        if gen.max_tokens > 0:
            queue = self.driver.submit(
                gen.request_id,
                gen.prompt,
                gen.prompt_tokens,
                gen.max_tokens,
                kv_transfer_s=gen.kv_transfer_s,
                adapter=gen.adapter,
            )
        jitter, text = plan.jitter(), gen.tokens()
        emitted, finished = 0, queue is None
        while True:
            fault = plan.interruption(emitted)
            if fault is not None or finished or queue is None:
                return emitted, fault
            event = await _next_event(queue, self._watcher)
            await _pause(jitter.next_s(), self._watcher)
            await emit(text.next())
            emitted += 1
            finished = event.finished

    async def _interrupt(self, fault: Interruption) -> Outcome:
        if fault == "crash":
            self.counters.crashed_injected += 1
            await reset_connection(self._receive, self._watcher)
            return "crashed"
        self.counters.stalled_injected += 1
        while not self._watcher.done():
            if self._shutting_down():
                # the server is stopping: drop the silent connection rather than hold up the shutdown
                with contextlib.suppress(InjectedCrash):
                    await reset_connection(self._receive, self._watcher)
                break
            await asyncio.wait({self._watcher}, timeout=STALL_POLL_S)
        raise ClientGone


async def _pause(delay_s: float, watcher: asyncio.Task[None]) -> None:
    """Sleep `delay_s`, or raise `ClientGone` as soon as the client leaves."""
    if delay_s <= 0:
        return
    done, _ = await asyncio.wait({watcher}, timeout=delay_s)
    if done:
        raise ClientGone


async def _next_event(queue: asyncio.Queue[TokenEvent], watcher: asyncio.Task[None]) -> TokenEvent:
    """The next token event, or `ClientGone` once the client has left. The watcher is checked before a
    queued event too: after a disconnect uvicorn's `send` returns without writing, so a fast engine whose
    queue never runs dry would otherwise generate into the dead connection until `max_tokens` (the abort
    then shows seconds late)."""
    if watcher.done():
        raise ClientGone
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    raise ClientGone
