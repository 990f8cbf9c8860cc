"""Charge every failed attempt to what caused it: the replica, the request, or load.

Only a replica failure counts against the replica's circuit breaker. Without this, ten requests whose
prompts stall an engine, or a fleet saturated past its knee, open every breaker of a healthy pool and
turn a bad request (or overload) into a fleet outage.

Rules, per failed attempt (`FailureKind` from `gateway.proxy.retry_policy.failure_kind`):

- **replica**: a connect failure, always (the replica is also held out by passive health). A 5xx, a
  missed first-token deadline or a broken stream on a replica that has *not* answered another request
  successfully within `attribution.window_s`: nothing shows that it still works.
- **request**: an engine 4xx other than 429 (400, 413, 422: the engine refused the request itself), a
  non-streamed response past its total bound (its own length), and a 5xx / first-token miss / broken
  stream that repeats with the same kind on a second replica while both kept serving other requests
  within the window. The last case is a poison request: the serve loop quarantines it
  (`gateway.proxy.quarantine`) instead of sending it to a third replica.
- **load**: an engine 429/503 (it says it is overloaded; its Retry-After holds the replica out, the
  breaker is not charged), and a missed first-token deadline while the replica's engine reports at
  least `saturated_waiting_requests` waiting or `saturated_kv_usage_ratio` KV use (a fresh scrape), or
  while every routable replica of the pool missed a deadline within the window. Saturation is
  admission's to handle (429 with Retry-After), not the breaker's.

A failure that could still turn out to be the request's (the replica kept serving others) is
*pending*: it is charged to the replica when the request ends without a second such failure
(`RequestFailures.settle`), so a replica that really broke is still charged, one request later at most.
Each charged failure is counted as `llm_gateway_upstream_failures_total{model,cause,kind}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from core.clock import Clock
from gateway.pool_settings import AttributionSettings
from gateway.upstream.registry import FailureKind, Pool
from gateway.upstream.replica import Replica

SUSPECT_KINDS = frozenset({FailureKind.STATUS_5XX, FailureKind.TTFT_TIMEOUT, FailureKind.STREAM_BROKEN})
"""Kinds that are the replica's or the request's: which one takes evidence from other requests."""


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


class TtftMisses:
    """When each replica of a pool last missed a first-token deadline (pool-wide saturation evidence)."""

    def __init__(self) -> None:
        self._last_miss_s: dict[str, float] = {}

    def record(self, replica_id: str, now_s: float) -> None:
        self._last_miss_s[replica_id] = now_s

    def forget(self, *replica_ids: str) -> None:
        """Drop the replicas' last misses (they were a poison request's, not evidence of load)."""
        for replica_id in replica_ids:
            self._last_miss_s.pop(replica_id, None)

    def all_missed(self, pool: Pool, now_s: float, since_s: float) -> bool:
        """True when every routable replica of `pool` missed a deadline at or after `since_s`."""
        routable = [r for r in pool.replicas.values() if r.routable_at(now_s)]
        return bool(routable) and all(self._last_miss_s.get(r.replica_id, -1.0) >= since_s for r in routable)


@dataclass(slots=True)
class RequestFailures:
    """The failed attempts of one request and their causes (module docstring). One per request."""

    settings: AttributionSettings
    clock: Clock
    misses: TtftMisses
    pending: list[tuple[Replica, FailureKind]] = field(default_factory=list)

    def record(self, kind: FailureKind | None, replica: Replica, pool: Pool) -> Verdict:
        """Classify one failed attempt on `replica` (`kind`: `retry_policy.failure_kind` of the error)."""
        now_s = self.clock.now_s()
        if kind is FailureKind.TTFT_TIMEOUT:
            self.misses.record(replica.replica_id, now_s)
        if kind is None:  # the engine refused the request (4xx), or it ran past its own total bound
            return Verdict((Charge(replica, kind, FailureCause.REQUEST),))
        if kind is FailureKind.CONNECT:
            return Verdict((Charge(replica, kind, FailureCause.REPLICA),))
        if kind is FailureKind.OVERLOADED or (
            kind is FailureKind.TTFT_TIMEOUT and self._saturated(replica, pool)
        ):
            return Verdict((Charge(replica, kind, FailureCause.LOAD),))
        if not self._serves_others(replica, now_s):
            return Verdict((Charge(replica, kind, FailureCause.REPLICA),))
        for index, (earlier, earlier_kind) in enumerate(self.pending):
            repeated = earlier.replica_id != replica.replica_id and earlier_kind is kind
            if repeated and self._serves_others(earlier, now_s):
                del self.pending[index]
                self.misses.forget(earlier.replica_id, replica.replica_id)  # the request's, not load
                charges = (
                    Charge(earlier, kind, FailureCause.REQUEST),
                    Charge(replica, kind, FailureCause.REQUEST),
                )
                return Verdict(charges, quarantine=True)
        self.pending.append((replica, kind))
        return Verdict()

    def settle(self) -> tuple[Charge, ...]:
        """The request ended: failures still pending were the replicas' (charged now), once."""
        charges = tuple(Charge(replica, kind, FailureCause.REPLICA) for replica, kind in self.pending)
        self.pending.clear()
        return charges

    def _serves_others(self, replica: Replica, now_s: float) -> bool:
        last = replica.last_success_s
        return last is not None and now_s - last <= self.settings.window_s

    def _saturated(self, replica: Replica, pool: Pool) -> bool:
        """The replica's engine says it is saturated, or every routable replica is missing deadlines."""
        engine = replica.engine
        if engine is not None and not engine.stale:
            s = self.settings
            if (
                engine.waiting >= s.saturated_waiting_requests
                or engine.kv_usage_ratio >= s.saturated_kv_usage_ratio
            ):
                return True
        now_s = self.clock.now_s()
        return self.misses.all_missed(pool, now_s, now_s - self.settings.window_s)


class PoolAttribution:
    """A pool's attribution settings and its pool-wide evidence (first-token misses by replica)."""

    def __init__(self, settings: AttributionSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._misses = TtftMisses()

    def for_request(self) -> RequestFailures:
        """The failure record of one new request."""
        return RequestFailures(self._settings, self._clock, self._misses)
