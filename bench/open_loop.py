"""An open-loop block for `bench.cpu_per_request.interleaved_blocks`: requests start at a fixed rate,
whether or not earlier ones have finished, so the server carries a set load instead of as much as it can
take (a closed loop).

Why (`bench.workers_throughput --per-worker-rate`): a server's CPU per request falls as its load rises
(an event loop that wakes for many ready sockets at once pays its wake-up once for all of them), so
gateways compared in one closed loop, where one worker runs near a core's worth and each of two workers
near half of one, differ by their load as much as by their code. At the same rate per worker the
comparison is of the code.

Requests start at `i / rate_per_s` after the block's start (late ones at once, none skipped), at most
`MAX_IN_FLIGHT` at a time; an answer that is not a 200 raises `OpenLoopFailed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp

MAX_IN_FLIGHT = 512


class OpenLoopFailed(RuntimeError):
    """A request of an open-loop block was not answered 200."""


async def open_loop(
    session: aiohttp.ClientSession, url: str, bodies: Sequence[bytes], *, requests: int, rate_per_s: float
) -> None:
    """POST `requests` chat bodies to `url`/v1/chat/completions at `rate_per_s` (module docstring)."""
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    headers = {"content-type": "application/json"}

    async def one(i: int) -> None:
        async with (
            slots,
            session.post(
                f"{url}/v1/chat/completions", data=bodies[i % len(bodies)], headers=headers
            ) as answer,
        ):
            body = await answer.read()
            if answer.status != 200:
                raise OpenLoopFailed(f"{url}: status {answer.status}: {body[:200]!r}")

    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = []
    for i in range(requests):
        wait_s = started + i / rate_per_s - loop.time()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
