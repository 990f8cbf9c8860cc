"""`core.tasks.cancel_and_wait`: every task ends, also one whose first cancellation was swallowed."""

from __future__ import annotations

import asyncio

import pytest

from core import tasks


async def test_a_swallowed_cancellation_is_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `asyncio.wait_for` on Python 3.11 does when the result and the cancellation arrive together: the
    loop goes on, and only a second cancellation ends it."""
    monkeypatch.setattr(tasks, "RECANCEL_AFTER_S", 0.01)
    swallowed = 0

    async def loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await tasks.cancel_and_wait([task, None])
    assert task.cancelled() and swallowed == 1


async def test_other_exceptions_propagate() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            raise RuntimeError("in cleanup")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="in cleanup"):
        await tasks.cancel_and_wait([task])
