"""Waiting for something to happen in a test: poll a condition until it holds or a deadline passes.

Use these instead of sleeping a fixed time: they return as soon as the condition holds (fast on a quiet
machine) and fail with a message naming what never happened (instead of a later, puzzling assertion).
A sleep is still right when the passing of time *is* the behaviour under test (an idle period in which
nothing may happen); say so in a comment where it stays.

    await eventually(lambda: depth() == 1, what="the request queued")           # async tests
    await eventually(store_has_key, what="the key expired")                     # async condition too
    wait_for(lambda: app.draining, what="the gateway started draining")         # sync tests
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_INTERVAL_S = 0.005


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "",
) -> None:
    """Poll `condition` (a plain or async callable) on the running loop until it is true; AssertionError
    naming `what` when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what or _name(condition)}")
        await asyncio.sleep(interval_s)


def wait_for(
    condition: Callable[[], bool],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = DEFAULT_INTERVAL_S,
    what: str = "",
) -> None:
    """Blocking variant of `eventually` for synchronous tests (the servers run in their own threads)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what or _name(condition)}")
        time.sleep(interval_s)


def _name(condition: Callable[..., object]) -> str:
    return getattr(condition, "__qualname__", repr(condition))
