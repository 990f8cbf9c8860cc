"""Load evidence that failure attribution reads (`gateway.proxy.failure_attribution`): each replica's
recent first-token outcomes and its recent silent streams, over a sliding window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class FirstTokenOutcomes:
    """Each replica's recent first-token outcomes (missed or served) over a sliding window, with running
    counts so a ratio costs O(1) amortised."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._by_replica: dict[str, _Window] = {}

    def record(self, replica_id: str, now_s: float, *, missed: bool) -> None:
        window = self._by_replica.setdefault(replica_id, _Window())
        window.events.append((now_s, missed))
        window.misses += missed
        self._prune(window, now_s)

    def miss_ratio(self, replica_id: str, now_s: float) -> float:
        """Missed ÷ all first-token outcomes in the window (0 without any)."""
        window = self._by_replica.get(replica_id)
        if window is None:
            return 0.0
        self._prune(window, now_s)
        return window.misses / len(window.events) if window.events else 0.0

    def _prune(self, window: _Window, now_s: float) -> None:
        events = window.events
        while events and now_s - events[0][0] > self._window_s:
            _, missed = events.popleft()
            window.misses -= missed


@dataclass(slots=True)
class _Window:
    events: deque[tuple[float, bool]] = field(default_factory=deque)
    misses: int = 0


class StallLog:
    """Each replica's recent silent streams (idle timeouts) over a sliding window, by request key (its
    fingerprint once known, so identical requests count as one), so a request's own stalls can be told
    from others'. A healthy replica silences no stream at all, so one stall of another request in the
    window is evidence (a count, not a ratio over few streams)."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._by_replica: dict[str, deque[tuple[float, str]]] = {}

    def record(self, replica_id: str, now_s: float, request: str) -> None:
        stalls = self._by_replica.setdefault(replica_id, deque())
        stalls.append((now_s, request))
        self._prune(stalls, now_s)

    def others(self, replica_id: str, now_s: float, request: str) -> int:
        """Stalls of requests other than `request` on the replica within the window."""
        stalls = self._by_replica.get(replica_id)
        if not stalls:
            return 0
        self._prune(stalls, now_s)
        return sum(1 for _, by in stalls if by != request)

    def forget(self, request: str) -> None:
        """Drop `request`'s stalls: they were charged to it (a poison request), so they are no evidence
        of load against the next one."""
        for replica_id, stalls in self._by_replica.items():
            self._by_replica[replica_id] = deque(stall for stall in stalls if stall[1] != request)

    def _prune(self, stalls: deque[tuple[float, str]], now_s: float) -> None:
        while stalls and now_s - stalls[0][0] > self._window_s:
            stalls.popleft()
