"""The write deadline of the proxy endpoints' client sends: one timer for all of them, none per request.

A send the client does not take within `server.write_timeout_s` ends its request (`ClientIO.send`).
Every send under way is one entry of a table kept in the order the sends started (oldest first: the
clock never goes back), removed when the send returns, however it ends. One timer (`EarliestTimer`) is
armed at the oldest entry's deadline when none is pending; when it fires it ends every send past its
deadline and re-arms for the oldest one left, or stays unarmed when no send is under way. So a send
costs a clock read and two dict operations, there is no timer per request or per send, and nothing of a
finished request is reachable from the event loop: a timer armed by a request and left to run after its
response would hold the request, its connection and its buffers until it fired — a write timeout's
worth of finished requests held at once, which full garbage collections then walk (docs/BENCHMARKS.md,
"Per-request leftovers and GC pauses").

The timer fires at most once per deadline while sends keep coming, and a stalled send is ended at its
deadline (to the loop's resolution), not later.
"""

from __future__ import annotations

from typing import Protocol

from admission.timers import EarliestTimer, LoopTimers, Timers
from core.clock import Clock, SystemClock


class Sender(Protocol):
    """What the deadline ends: a client side with one send at a time (ASGI's rule)."""

    def write_expired(self) -> None:
        """Its send under way has waited the whole deadline: end it."""
        ...


class WriteDeadlines:
    """The deadline of every client send under way (module docstring); one per application."""

    def __init__(self, timeout_s: float, clock: Clock | None = None, timers: Timers | None = None) -> None:
        self.timeout_s = timeout_s
        self._clock = clock or SystemClock()
        self._sending: dict[Sender, float] = {}
        """Each send under way and when it started, in that order."""
        self._timer = EarliestTimer(timers or LoopTimers(self._clock), self._expire)

    @property
    def under_way(self) -> int:
        """Sends started and not returned."""
        return len(self._sending)

    def begin(self, sender: Sender) -> None:
        """`sender` starts a send now: it is ended unless `end(sender)` comes within the deadline."""
        now_s = self._clock.now_s()
        self._sending.pop(sender, None)  # a new start goes to the end of the order
        self._sending[sender] = now_s
        self._timer.arm(now_s + self.timeout_s)  # a no-op while the timer waits for an older send

    def end(self, sender: Sender) -> None:
        """`sender`'s send returned (taken, failed or cancelled): its deadline no longer runs."""
        self._sending.pop(sender, None)

    def _expire(self) -> None:
        now_s = self._clock.now_s()
        while self._sending:
            sender, started_s = next(iter(self._sending.items()))
            due_s = started_s + self.timeout_s
            if due_s > now_s:
                self._timer.arm(due_s)
                return
            del self._sending[sender]
            sender.write_expired()
