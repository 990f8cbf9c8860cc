"""One try of a request on one replica: the slot it runs on, when it started, the open response.

The serve loop (`gateway.proxy.serving`) makes one `Attempt` per try and closes it when the try ends,
whatever the outcome: a response read to its end has already returned its connection to the pool; an
unfinished one is closed, which aborts the generation on the engine (the client left, or the try
failed). The first-token deadline of a try runs from its `started_s`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiohttp

from gateway.upstream.slot import Slot


@dataclass(slots=True, eq=False)
class Attempt:
    """One upstream try (see the module docstring)."""

    slot: Slot
    number: int
    """1 for the first try of the request, 2 for the next, …"""
    started_s: float = field(default_factory=time.perf_counter)
    response: aiohttp.ClientResponse | None = None
    preempted: bool = False
    """Cut by a preemption notice (`gateway.proxy.preemption`): its failure is not the replica's."""

    def elapsed_s(self) -> float:
        """Seconds since this try started."""
        return time.perf_counter() - self.started_s

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
