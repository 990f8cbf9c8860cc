"""Drives an `EngineCore` in wall-clock time for the HTTP server.

Simulated time: `sim_s = (clock() − start) × speed`. The driver sleeps until the core's next event (or a
new submission) and hands each `TokenEvent` to the waiting request's queue. With `speed = 20`, one wall
second simulates twenty engine seconds, so CI load tests finish quickly with the same physics.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from mock_engine.core import EngineCore, EngineRequest, TokenEvent


class EngineDriver:
    def __init__(
        self, core: EngineCore, speed: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.core = core
        self.speed = speed
        self._clock = clock
        self._start = clock()
        self._queues: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def sim_now_s(self) -> float:
        return (self._clock() - self._start) * self.speed

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(
        self,
        request_id: str,
        prompt: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        kv_transfer_s: float = 0.0,
        adapter: str | None = None,
    ) -> asyncio.Queue[TokenEvent]:
        """`kv_transfer_s` in simulated seconds, `adapter` the LoRA adapter or None (see `EngineRequest`)."""
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._queues[request_id] = queue
        request = EngineRequest(
            request_id, prompt, prompt_tokens, max_tokens, self.sim_now_s(), kv_transfer_s, adapter
        )
        self.core.submit(request)
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> None:
        if self._queues.pop(request_id, None) is not None:
            self.core.abort(request_id)
            self._wake.set()

    def finish(self, request_id: str) -> None:
        self._queues.pop(request_id, None)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            for event in self.core.advance(self.sim_now_s()):
                queue = self._queues.get(event.request_id)
                if queue is not None:
                    queue.put_nowait(event)
            next_s = self.core.next_event_s()
            if next_s is None:
                await self._wake.wait()
                continue
            delay_s = max(0.0, (next_s - self.sim_now_s()) / self.speed)
            if delay_s == 0.0:
                await asyncio.sleep(0)
                continue
            try:
                async with asyncio.timeout(delay_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
