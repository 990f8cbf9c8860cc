"""Per-replica circuit breaker: a pure state machine over an injected clock.

    CLOSED     → OPEN       after `consecutive_failures` failures in a row, or when the failure ratio
                            over the last `window_s` seconds reaches `failure_ratio` with at least
                            `min_requests` outcomes in the window;
    OPEN       → HALF_OPEN  once `open_s` has passed (the cooldown doubles, up to `max_open_s`, each time
                            a half-open probe fails);
    HALF_OPEN  → CLOSED     when the single probe succeeds; → OPEN when it fails.

While OPEN nothing is sent; while HALF_OPEN exactly one request (the probe) is let through. What counts
as a failure is the caller's call (the proxy: connect errors, 5xx, first-token timeouts, broken streams;
not 4xx, not 429, not client disconnects).

The pool's ejection budget reaches the breaker as an injected `may_open()` (the registry's pool answers
it; see `ejection_budget`): a CLOSED breaker whose thresholds are reached asks it before opening, and
when it says no the breaker stays CLOSED and `record_failure` says `TRIP_REFUSED`. Its failure counts
are kept (the streak and the window go on), so it opens at its next failure once the budget has room
(a success still ends the streak, as always). A failed half-open probe re-opens without asking: a
HALF_OPEN breaker is already ejected.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from math import floor


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


BREAKER_STATE_VALUE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}
"""Numeric encoding for the `llm_gateway_breaker_state` gauge."""

_RATIO_EPSILON = 1e-9
"""Slack for `ratio × n` in floating point (0.29 × 100 is 28.999…, and must give 29)."""


class FailureEffect(StrEnum):
    """What `CircuitBreaker.record_failure` did with a failure."""

    COUNTED = "counted"
    """Counted; the state did not change."""
    OPENED = "opened"
    """CLOSED → OPEN: the replica is ejected."""
    REOPENED = "reopened"
    """HALF_OPEN → OPEN: the probe failed (the cooldown doubled)."""
    TRIP_REFUSED = "trip_refused"
    """The thresholds were reached but `may_open()` said no (the pool's ejection budget is spent)."""


def ejection_budget(replicas: int, max_ejected_ratio: float) -> int:
    """How many of a pool's `replicas` may be circuit-open at once: floor(ratio × n), and at least one
    when the pool has two or more replicas (as Envoy's `max_ejection_percent`); 0 for a lone replica
    unless the ratio is 1."""
    budget = floor(max_ejected_ratio * replicas + _RATIO_EPSILON)
    return max(1, budget) if replicas >= 2 else budget


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    consecutive_failures: int = 5
    failure_ratio: float = 0.5
    min_requests: int = 20
    window_s: float = 10.0
    open_s: float = 5.0
    max_open_s: float = 60.0


class CircuitBreaker:
    """See the module docstring. `allows()` is side-effect free; `on_dispatch()` claims the probe."""

    def __init__(
        self,
        policy: BreakerPolicy,
        clock: Callable[[], float],
        may_open: Callable[[], bool] = lambda: True,
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._may_open = may_open
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._failures_in_window = 0
        self._opened_at_s = 0.0
        self._open_for_s = policy.open_s
        self._probe_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at_s >= self._open_for_s:
            self._state = BreakerState.HALF_OPEN
            self._probe_in_flight = False
        return self._state

    def allows(self) -> bool:
        """True when a new request may be routed here now."""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._probe_in_flight)

    def on_dispatch(self) -> None:
        """A request was routed here; in HALF_OPEN it is the one probe."""
        if self.state is BreakerState.HALF_OPEN:
            self._probe_in_flight = True

    def on_release(self) -> None:
        """A request here ended. If it was the half-open probe and no verdict was recorded (the client
        left first), free the probe slot so another request can probe."""
        if self._state is BreakerState.HALF_OPEN:
            self._probe_in_flight = False

    @property
    def ejected(self) -> bool:
        """OPEN or HALF_OPEN: what the pool's ejection budget counts (the replica's other gates aside)."""
        return self.state is not BreakerState.CLOSED

    def seconds_until_probe(self) -> float:
        """Time until a request may be tried here again (0 when it may be now)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at_s + self._open_for_s - self._clock())

    def record_success(self) -> None:
        self._record(ok=True)
        self._consecutive = 0
        if self._state is BreakerState.HALF_OPEN:
            self._close()

    def record_failure(self) -> FailureEffect:
        self._record(ok=False)
        self._consecutive += 1
        state = self.state
        if state is BreakerState.HALF_OPEN:
            self._open(backoff=True)
            return FailureEffect.REOPENED
        if state is BreakerState.CLOSED and self._should_trip():
            if not self._may_open():
                return FailureEffect.TRIP_REFUSED
            self._open(backoff=False)
            return FailureEffect.OPENED
        return FailureEffect.COUNTED

    def _should_trip(self) -> bool:
        p = self._policy
        if self._consecutive >= p.consecutive_failures:
            return True
        total = len(self._outcomes)
        return total >= p.min_requests and self._failures_in_window / total >= p.failure_ratio

    def _record(self, ok: bool) -> None:
        now_s = self._clock()
        self._outcomes.append((now_s, ok))
        if not ok:
            self._failures_in_window += 1
        horizon_s = now_s - self._policy.window_s
        while self._outcomes and self._outcomes[0][0] < horizon_s:
            _, old_ok = self._outcomes.popleft()
            if not old_ok:
                self._failures_in_window -= 1

    def _open(self, backoff: bool) -> None:
        if backoff:
            self._open_for_s = min(self._policy.max_open_s, self._open_for_s * 2)
        self._state = BreakerState.OPEN
        self._opened_at_s = self._clock()
        self._probe_in_flight = False

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self._open_for_s = self._policy.open_s
        self._probe_in_flight = False
        self._outcomes.clear()
        self._failures_in_window = 0
