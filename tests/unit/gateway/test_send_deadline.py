"""The upstream send's deadline (`gateway.proxy.send.within`) behaves as `asyncio.timeout` around the
same await, and its aiohttp timeouts are built once per pair (`client_timeout`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gateway.proxy.send import client_timeout, within

Cut = Callable[[float, Awaitable[str]], Awaitable[str]]


async def with_asyncio_timeout(delay_s: float, awaitable: Awaitable[str]) -> str:
    async with asyncio.timeout(delay_s):
        return await awaitable


CUTS = [pytest.param(within, id="within"), pytest.param(with_asyncio_timeout, id="asyncio.timeout")]


async def answer(after_s: float, value: str = "done") -> str:
    await asyncio.sleep(after_s)
    return value


@pytest.mark.parametrize("cut", CUTS)
async def test_an_answer_in_time_is_returned_and_leaves_the_task_uncancelled(cut: Cut) -> None:
    assert await cut(1.0, answer(0.0)) == "done"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending


@pytest.mark.parametrize("cut", CUTS)
async def test_a_late_answer_is_a_timeout_error_and_the_awaited_work_is_cancelled(cut: Cut) -> None:
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    with pytest.raises(TimeoutError):
        await cut(0.01, slow())
    assert cancelled.is_set()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("delay_s", [0.0, -1.0])
async def test_a_deadline_already_past_still_starts_the_work_then_times_out(cut: Cut, delay_s: float) -> None:
    started = []

    async def work() -> str:
        started.append(True)
        await asyncio.sleep(10)
        return "never"

    with pytest.raises(TimeoutError):
        await cut(delay_s, work())
    assert started == [True]


@pytest.mark.parametrize("cut", CUTS)
async def test_someone_elses_cancellation_stays_a_cancellation(cut: Cut) -> None:
    task = asyncio.create_task(cut(10.0, answer(10.0)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("cut", CUTS)
async def test_an_outside_cancellation_with_the_deadline_stays_a_cancellation(cut: Cut) -> None:
    async def both() -> str:
        current = asyncio.current_task()
        assert current is not None
        asyncio.get_running_loop().call_later(0.01, current.cancel)  # the client leaves as the deadline falls
        return await cut(0.01, answer(10.0))

    task = asyncio.create_task(both())
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("cut", CUTS)
async def test_an_error_of_the_awaited_work_passes_through(cut: Cut) -> None:
    async def failing() -> str:
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        await cut(1.0, failing())


def test_client_timeout_is_built_once_per_pair_with_no_total() -> None:
    timeout = client_timeout(2.0, 60.0)
    assert timeout is client_timeout(2.0, 60.0)
    assert (timeout.total, timeout.connect, timeout.sock_connect, timeout.sock_read) == (None, 2.0, 2.0, 60.0)
    assert client_timeout(2.0, 30.0).sock_read == 30.0
