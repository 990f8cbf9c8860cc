"""Stopping background asyncio tasks: every loop of the gateway stops the same way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

RECANCEL_AFTER_S = 1.0
"""A cancelled task still running this long after its cancellation is cancelled again (and again, at
this period, until it ends): a library swallowed the cancellation. On Python 3.11 `asyncio.wait_for`
(which redis-py's calls run under) returns the awaited result instead of raising when the cancellation
and the result arrive together, so a loop cancelled at that moment goes on looping and its stop would
wait forever."""


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task (None entries skipped), then wait for each to finish; their cancellation is
    swallowed, any other exception propagates. All are cancelled before the first wait, so a slow one
    never delays the others' cancellation. A task that outlives its cancellation by `RECANCEL_AFTER_S`
    is cancelled again (logged)."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        while not (await asyncio.wait([task], timeout=RECANCEL_AFTER_S))[0]:
            logger.warning("task %s outlived its cancellation (swallowed): cancelled again", task.get_name())
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
