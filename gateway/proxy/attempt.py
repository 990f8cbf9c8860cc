"""One try of a request on one replica: the slot it runs on, when it started, the open response.

The serve loop (`gateway.proxy.serving`) has its pool's legs make one `Attempt` per leg of a try and
close it when the leg ends, whatever the outcome: a response read to its end has already returned its
connection to the pool; an unfinished one is closed, which aborts the generation on the engine (the
client left, or the try failed). The first-token deadline of a try runs from its `started_s`, read from
the app's injected clock (`core.clock`), like every request timing.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from core.clock import Clock
from gateway.upstream.slot import Slot


class Attempt:
    """One upstream try (see the module docstring)."""

    __slots__ = ("_now_s", "number", "preempted", "response", "slot", "started_s")

    def __init__(self, slot: Slot, number: int, clock: Clock, started_s: float | None = None) -> None:
        """`started_s` (the clock's time) when the try's deadlines run from an earlier moment (a
        disaggregated decode leg's run from its prefill leg's start); else now."""
        self.slot = slot
        self.number = number
        """1 for the first try of the request, 2 for the next, …"""
        self._now_s: Callable[[], float] = clock.now_s
        self.started_s = self._now_s() if started_s is None else started_s
        self.response: aiohttp.ClientResponse | None = None
        self.preempted = False
        """Cut by a preemption notice (`gateway.proxy.preemption`): its failure is not the replica's."""

    def elapsed_s(self) -> float:
        """Seconds since this try started."""
        return self._now_s() - self.started_s

    def preempt(self) -> None:
        """Cut the try now: closing its response makes the relay's read fail, and the serve loop
        continues or retries the request elsewhere."""
        self.preempted = True
        self.close()

    def close(self) -> None:
        """Close the upstream response, if any (idempotent)."""
        response, self.response = self.response, None
        if response is not None:
            response.close()
