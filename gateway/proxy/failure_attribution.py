"""Charge every failed attempt to what caused it: the replica, the request, or load.

Only a replica failure counts against the replica's circuit breaker. Without this, ten requests whose
prompts stall an engine, or a fleet saturated past its knee, open every breaker of a healthy pool and
turn a bad request (or overload) into a fleet outage.

Evidence. A replica *serves others* when it delivered a whole response to another request within
`attribution.window_s` (`Replica.last_success_s`, set by `ReplicaRegistry.record_served`). The pool is
*saturated* for a missed first token when the replica's engine reports at least
`saturated_waiting_requests` waiting or `saturated_kv_usage_ratio` KV use (a fresh scrape), or when
every routable replica of the pool missed at least half of its recent first tokens
(`FirstTokenOutcomes`, over the same window: one miss among many served tokens is not load).

Rules, per failed attempt (`FailureKind` from `gateway.proxy.retry_policy.failure_kind`):

- **request**: an engine 4xx other than 429 (the engine refused the request itself) and a response past
  its own total bound (kind None); and a 5xx, broken stream or missed first token that *repeats with the
  same kind on a second replica* while both serve others — a poison request, which the serve loop
  quarantines instead of sending to a third replica (`gateway.proxy.quarantine`). Missed first tokens
  make a poison request only when both replicas deliver most of their first tokens in time (under
  half missed) and the pool is not saturated: under overload they repeat everywhere. Known limit: in a
  partly saturated pool (a replica missing, say, 40 % of its first tokens), a request that misses on
  two such replicas can be quarantined wrongly; the TTL bounds it, and `quarantine.enabled: false`
  turns quarantine off for a pool.
- **load**: an engine 429/503 (it says it is overloaded: its Retry-After holds the replica out, the
  breaker is not charged) and a missed first token while the pool is saturated. Saturation is
  admission's to handle (429 with Retry-After), not the breaker's.
- **replica**: a connect failure, always (the replica is also held out by passive health); a 5xx,
  broken stream or missed first token on a replica that does not serve others.
- otherwise the failure is *pending* until the request ends (`RequestFailures.settle`): it is the
  request's when the replica delivered another response after it (it kept working), else the
  replica's (or load's, for a missed first token in a saturated pool) when the request was then served
  by another replica, or when its replica delivered nothing since; the request's when it was not served
  elsewhere (no second try, or a different failure) and its replica kept delivering to others. So a
  replica that breaks some of its streams is charged for each (the requests were fine elsewhere), a
  replica that really broke is charged at most one request later, and a poison request whose retry the
  budget refused does not open a breaker of a replica that keeps serving everyone else.

Each charged failure is counted as `llm_gateway_upstream_failures_total{model,cause,kind}`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from core.clock import Clock
from gateway.pool_settings import AttributionSettings
from gateway.upstream.registry import FailureKind, Pool
from gateway.upstream.replica import Replica

SATURATED_MISS_RATIO = 0.5
"""Share of a replica's recent first tokens that missed their deadline above which it counts as saturated."""


class FailureCause(StrEnum):
    """What a failed attempt is charged to (a label of `llm_gateway_upstream_failures_total`)."""

    REPLICA = "replica"
    REQUEST = "request"
    LOAD = "load"


@dataclass(frozen=True, slots=True)
class Charge:
    """One failed attempt, charged: the replica it ran on, its kind, its cause."""

    replica: Replica
    kind: FailureKind | None
    cause: FailureCause


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the serve loop does with a failed attempt: `charges` to account now (possibly an earlier
    pending attempt too) and whether the request is a poison request (`quarantine`)."""

    charges: tuple[Charge, ...] = ()
    quarantine: bool = False


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


@dataclass(slots=True)
class _Pending:
    replica: Replica
    pool: Pool
    kind: FailureKind
    failed_at_s: float
    default: FailureCause


@dataclass(slots=True)
class RequestFailures:
    """The failed attempts of one request and their causes (module docstring). One per request."""

    settings: AttributionSettings
    clock: Clock
    outcomes: FirstTokenOutcomes
    pending: list[_Pending] = field(default_factory=list)

    def record(self, kind: FailureKind | None, replica: Replica, pool: Pool) -> Verdict:
        """Classify one failed attempt on `replica` (`kind`: `retry_policy.failure_kind` of the error)."""
        now_s = self.clock.now_s()
        if kind is FailureKind.TTFT_TIMEOUT:
            self.outcomes.record(replica.replica_id, now_s, missed=True)
        if kind is None:  # the engine refused the request (4xx), or it ran past its own total bound
            return self._now(replica, kind, FailureCause.REQUEST)
        if not self.settings.enabled:  # the breaker as it was: every failure is the replica's
            return self._now(
                replica, kind, FailureCause.LOAD if kind is FailureKind.OVERLOADED else FailureCause.REPLICA
            )
        if kind is FailureKind.CONNECT:
            return self._now(replica, kind, FailureCause.REPLICA)
        if kind is FailureKind.OVERLOADED:
            return self._now(replica, kind, FailureCause.LOAD)
        saturated = kind is FailureKind.TTFT_TIMEOUT and self._saturated(replica, pool, now_s)
        serves_others = self._serves_others(replica, now_s)
        if serves_others and not saturated:
            for index, earlier in enumerate(self.pending):
                repeated = earlier.replica.replica_id != replica.replica_id and earlier.kind is kind
                if (
                    repeated
                    and self._serves_others(earlier.replica, now_s)
                    and self._delivers_first_tokens(kind, (earlier.replica, replica), now_s)
                ):
                    del self.pending[index]
                    charges = (
                        Charge(earlier.replica, kind, FailureCause.REQUEST),
                        Charge(replica, kind, FailureCause.REQUEST),
                    )
                    return Verdict(charges, quarantine=True)
        default = FailureCause.LOAD if saturated else FailureCause.REPLICA
        if not serves_others:
            return self._now(replica, kind, default)
        self.pending.append(_Pending(replica, pool, kind, now_s, default))
        return Verdict()

    def settle(self, *, served: bool) -> tuple[Charge, ...]:
        """The request ended (`served`: another replica answered it). Each failure still pending is its
        default cause (the replica's, or load) when the request was served elsewhere — the request was
        fine, the replica was not; otherwise (no second try, or it failed differently) the request's
        when its replica delivered another response since, else its default cause. Once."""
        charges = tuple(Charge(p.replica, p.kind, self._settled_cause(p, served)) for p in self.pending)
        self.pending.clear()
        return charges

    def _settled_cause(self, pending: _Pending, served: bool) -> FailureCause:
        if not served and _served_since(pending):
            return FailureCause.REQUEST
        now_s = self.clock.now_s()
        if pending.kind is FailureKind.TTFT_TIMEOUT and self._saturated(pending.replica, pending.pool, now_s):
            return FailureCause.LOAD  # the pool saturated while the request went on: load, not the replica
        return pending.default

    def _now(self, replica: Replica, kind: FailureKind | None, cause: FailureCause) -> Verdict:
        return Verdict((Charge(replica, kind, cause),))

    def _delivers_first_tokens(
        self, kind: FailureKind, replicas: tuple[Replica, Replica], now_s: float
    ) -> bool:
        """For missed first tokens: both replicas deliver most of their first tokens in time (below
        `SATURATED_MISS_RATIO` missed), so this request's misses are its own, not a busy replica's."""
        if kind is not FailureKind.TTFT_TIMEOUT:
            return True
        return all(self.outcomes.miss_ratio(r.replica_id, now_s) < SATURATED_MISS_RATIO for r in replicas)

    def _serves_others(self, replica: Replica, now_s: float) -> bool:
        last = replica.last_success_s
        return last is not None and now_s - last <= self.settings.window_s

    def _saturated(self, replica: Replica, pool: Pool, now_s: float) -> bool:
        """The replica's engine says it is saturated, or every routable replica misses most deadlines."""
        engine = replica.engine
        s = self.settings
        engine_saturated = (
            engine is not None
            and not engine.stale
            and (
                engine.waiting >= s.saturated_waiting_requests
                or engine.kv_usage_ratio >= s.saturated_kv_usage_ratio
            )
        )
        if engine_saturated:
            return True
        routable = [r for r in pool.replicas.values() if r.routable_at(now_s)]
        return bool(routable) and all(
            self.outcomes.miss_ratio(r.replica_id, now_s) >= SATURATED_MISS_RATIO for r in routable
        )


def _served_since(pending: _Pending) -> bool:
    last = pending.replica.last_success_s
    return last is not None and last > pending.failed_at_s


class PoolAttribution:
    """A pool's attribution settings and its pool-wide evidence (first-token outcomes by replica)."""

    def __init__(self, settings: AttributionSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._outcomes = FirstTokenOutcomes(settings.window_s)

    def for_request(self) -> RequestFailures:
        """The failure record of one new request."""
        return RequestFailures(self._settings, self._clock, self._outcomes)

    def first_token_served(self, replica: Replica) -> None:
        """A try on `replica` got its first token in time (saturation evidence against)."""
        self._outcomes.record(replica.replica_id, self._clock.now_s(), missed=False)
