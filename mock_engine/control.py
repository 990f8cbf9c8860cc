"""Run-time fault control: the current settings, per-request plans, and the refusal side effects.

`update()` validates a partial change (raising `FaultSettingsError`), applies it, and makes the listening
sockets follow `refuse_connections` (see `listeners.py`), turning refusal off by itself after `refuse_for_s`.
Runs on the server's event loop; `MockEngineApp.set_faults_threadsafe` reaches it from other threads.
`routes()` are the admin endpoints: GET /mock/faults (the settings), POST (a partial update, answered with
the new settings; a bad change is a 400 naming the field, and nothing changes), DELETE (back to defaults).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any

import orjson

from mock_engine import openai_format as fmt
from mock_engine.asgi import ClientGone, Receive, Scope, Send, read_body, respond
from mock_engine.faults import FaultInjector, FaultPlan, FaultSettings, FaultSettingsError
from mock_engine.listeners import ListenerGate, find_uvicorn_server

logger = logging.getLogger(__name__)

STARTUP_WAIT_S = 30.0
STARTUP_POLL_S = 0.005
_REFUSE_FIELDS = frozenset({"refuse_connections", "refuse_for_s"})


class FaultControl:
    def __init__(self, settings: FaultSettings, rng: random.Random, gate: ListenerGate | None = None) -> None:
        self.injector = FaultInjector(settings, rng)
        self.gate = gate or ListenerGate()
        self._lock = asyncio.Lock()
        self._expiry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def settings(self) -> FaultSettings:
        return self.injector.settings

    def plan(self, prompt: str | None = None) -> FaultPlan:
        """The next request's fault plan; `prompt`: a generation's prompt text, checked for poison."""
        return self.injector.plan(prompt)

    async def update(self, changes: Mapping[str, Any]) -> FaultSettings:
        async with self._lock:
            new = self.settings.updated(changes)
            if new.refuse_connections and not self.gate.available:
                raise FaultSettingsError(
                    "refuse_connections",
                    "refuse_connections needs the uvicorn server that serves this app, and none was found",
                )
            self.injector.settings = new
            await self._follow_refusal(restart_timer=bool(_REFUSE_FIELDS & set(changes)))
            return new

    async def reset(self) -> FaultSettings:
        return await self.update(FaultSettings().as_dict())

    def routes(self) -> dict[tuple[str, str], Any]:
        """The admin endpoints (module docstring)."""
        return {
            ("GET", "/mock/faults"): self._get,
            ("POST", "/mock/faults"): self._set,
            ("DELETE", "/mock/faults"): self._clear,
        }

    async def _get(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, orjson.dumps(self.settings.as_dict()))

    async def _set(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(receive)
        except ClientGone:
            return
        try:
            changes = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            await respond(send, 400, _fault_error(f"invalid JSON: {exc}", ""))
            return
        try:
            settings = await self.update(changes)
        except FaultSettingsError as exc:
            await respond(send, 400, _fault_error(str(exc), exc.field))
            return
        await respond(send, 200, orjson.dumps(settings.as_dict()))

    async def _clear(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = await self.reset()
        await respond(send, 200, orjson.dumps(settings.as_dict()))

    def on_startup(self, app: object) -> None:
        """At lifespan startup: find the uvicorn server, and refuse from the start when so configured."""
        if not self.gate.available:
            server = find_uvicorn_server(app)
            if server is not None:
                self.gate.attach(server)
        if self.settings.refuse_connections and self.gate.available:
            self._spawn(self._refuse_once_started())

    def on_shutdown(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for task in self._tasks:
            task.cancel()
        self.gate.close()

    async def _refuse_once_started(self) -> None:
        for _ in range(int(STARTUP_WAIT_S / STARTUP_POLL_S)):
            if self.gate.started:
                break
            await asyncio.sleep(STARTUP_POLL_S)
        else:
            raise RuntimeError("the server did not start: cannot refuse connections")
        async with self._lock:
            await self._follow_refusal(restart_timer=True)

    async def _follow_refusal(self, restart_timer: bool) -> None:
        settings = self.settings
        if not self.gate.available:
            return
        if settings.refuse_connections and not self.gate.paused:
            await self.gate.pause()
        elif not settings.refuse_connections and self.gate.paused:
            await self.gate.resume()
        if not restart_timer and settings.refuse_connections:
            return
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if settings.refuse_connections and settings.refuse_for_s is not None:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_later(
                settings.refuse_for_s, lambda: self._spawn(self.update({"refuse_connections": False}))
            )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("mock engine fault control task failed", exc_info=task.exception())


def _fault_error(message: str, field: str) -> bytes:
    return fmt.error_body(message, 400, "invalid_fault_settings", field)
