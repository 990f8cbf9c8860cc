"""Stopping background asyncio tasks: every loop of the gateway stops the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task (None entries skipped), then wait for each to finish; their cancellation is
    swallowed, any other exception propagates. All are cancelled before the first wait, so a slow one
    never delays the others' cancellation."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError):
            await task
