"""Charge every failed attempt to what caused it: the replica, the request, or load.

Only a replica failure counts against the replica's circuit breaker. Without this, ten requests whose
prompts stall an engine, or a fleet saturated past its knee, open every breaker of a healthy pool and
turn a bad request (or overload) into a fleet outage.

Evidence. A replica *serves others* when it delivered a whole response to another request within
`attribution.window_s` (`Replica.last_success_s`, set by `ReplicaRegistry.record_served`). Its engine
is *saturated* when a fresh scrape reports at least `saturated_waiting_requests` waiting or
`saturated_kv_usage_ratio` KV use (a stale sample is no evidence). Two kinds of failure are symptoms of
load as much as of a bad request or replica, and have load evidence of their own:

- a **missed first token** (`TTFT_TIMEOUT`) is load when the engine is saturated, or when every routable
  replica of the pool missed at least half of its recent first tokens (`FirstTokenOutcomes`, over the
  window: one miss among many served tokens is not load);
- a **silent stream** (`STREAM_IDLE`: the replica sent nothing for the idle timeout) is load when the
  engine is saturated (a decode that is preempted, swapped out or starved by other prefills goes quiet
  while its engine queues), or when every other routable replica silenced *another request's* stream
  within the window (`StallLog`; fleet-wide silences are load, and ejecting one replica would only push
  its streams onto the others). A protocol break (`STREAM_BROKEN`: reset, bad framing, early close) is
  no symptom of load and has none.

Rules, per failed attempt (`FailureKind` from `gateway.proxy.retry_policy.failure_kind`):

- **request**: an engine 4xx other than 429 (the engine refused the request itself) and a response past
  its own total bound (kind None); and a 5xx, broken stream, silent stream or missed first token that
  *repeats with the same kind on a second replica* while both serve others, neither failure was load
  and neither replica shows load — a poison request, which the serve loop quarantines instead of
  sending to a third replica (`gateway.proxy.stores.quarantine`). "Shows load", per kind: missed first tokens,
  the replica misses half or more of its first tokens; silent streams, its engine is saturated or it
  silenced another request's stream within the window (a poison prompt silences engines that keep
  serving everyone else; its own two stalls do not count, nor those of requests already charged for
  theirs, so poison prompts one after another are each quarantined). So a silence under load, which
  repeats on every replica, never quarantines a request; without engine metrics (scrape off) the
  replicas' other stalls are the only evidence. The rule errs towards not quarantining: a wrong
  quarantine refuses the prompt, and every identical one (shared prefixes, retries), for the TTL,
  while a missed one costs at most `max_attempts` idle timeouts and never a breaker. Known limits: in a
  partly saturated pool (a replica missing, say, 40 % of its first tokens), a request that misses on
  two such replicas can be quarantined wrongly; so can a silence that neither sign shows (the gateway's
  host starved of CPU, an idle timeout shorter than a prefill). The TTL bounds it, and
  `quarantine.enabled: false` turns quarantine off for a pool. The other way round, a poison prompt
  on replicas that also silence others' streams (or several poison prompts at once) is not
  quarantined: it is retried up to `max_attempts`, each silence settled as pending failures are
  (below: load, or the request's while its replicas keep serving).
- **load**: an engine 429/503 (it says it is overloaded: its Retry-After holds the replica out, the
  breaker is not charged), and a missed first token or a silent stream with load evidence (above).
  Saturation is admission's to handle (429 with Retry-After), not the breaker's.
- **replica**: a connect failure, always (the replica is also held out by passive health); a 5xx,
  broken stream, silent stream or missed first token on a replica that does not serve others (load
  when there is load evidence).
- otherwise the failure is *pending* until the request ends (`RequestFailures.settle`): it is load's
  when it was load when it happened or there is load evidence now (the pool saturated while the
  request went on); else the request's when it was not served elsewhere (no second try, or a different
  failure) and its replica delivered another response after it (it kept working); else the replica's.
  So a replica that breaks some of its streams is charged for each (the requests were fine elsewhere),
  a replica that really broke is charged at most one request later, and a poison request whose retry
  the budget refused does not open a breaker of a replica that keeps serving everyone else.
- with the request's fingerprint known (quarantine on, `gateway.proxy.containment`), an unserved
  failure that would be the replica's is *held* instead of charged at the request's end
  (`RequestFailures.held`, decided by `resolve_held` up to `attribution.hold_s` later), and every
  unserved failure that is not load is *sighted* (`RequestFailures.sighted`): identical requests
  complete the poison rule across requests (`repeated_elsewhere`).

Each charged failure is counted as `llm_gateway_upstream_failures_total{model,cause,kind}` (kind:
connect, status_5xx, overloaded, ttft_timeout, stream_idle, stream_broken, none). The records
(a cause, a charge, the serve loop's verdict, a pending failure) are `gateway.proxy.failure_charges`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count

from core.clock import Clock
from gateway.config.pool_settings import AttributionSettings
from gateway.proxy.failure_charges import Charge, FailureCause, Pending, Verdict
from gateway.proxy.load_evidence import FirstTokenOutcomes, StallLog
from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool
from gateway.upstream.replica import Replica

SATURATED_MISS_RATIO = 0.5
"""Share of a replica's recent first tokens that missed their deadline above which it counts as saturated."""


@dataclass(slots=True)
class RequestFailures:
    """The failed attempts of one request and their causes (module docstring). One per request."""

    settings: AttributionSettings
    clock: Clock
    outcomes: FirstTokenOutcomes
    stalls: StallLog
    request: int
    """This request's number in its pool (tells its stalls from others' in `stalls`)."""
    pending: list[Pending] = field(default_factory=list)
    fingerprint: str | None = None
    """The request's quarantine fingerprint once known (`gateway.proxy.containment` sets it): its stalls
    are filed under it, and `settle` hands its unserved failures on instead of charging them."""
    sighted: list[Pending] = field(default_factory=list)
    """Failures of a request that ended unserved with no load evidence (`settle`): where it failed."""
    held: list[Pending] = field(default_factory=list)
    """Of those, the ones not charged yet: the replica's unless the fingerprint fails elsewhere too."""

    @property
    def key(self) -> str:
        """The request's key in the stall log: its fingerprint, else its number."""
        return self.fingerprint or f"#{self.request}"

    def record(self, kind: FailureKind | None, replica: Replica, pool: Pool) -> Verdict:
        """Classify one failed attempt on `replica` (`kind`: `retry_policy.failure_kind` of the error)."""
        now_s = self.clock.now_s()
        if kind is FailureKind.TTFT_TIMEOUT:
            self.outcomes.record(replica.replica_id, now_s, missed=True)
        elif kind is FailureKind.STREAM_IDLE:
            self.stalls.record(replica.replica_id, now_s, self.key)
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
        saturated = self._load(kind, replica, pool, now_s)
        serves_others = self._serves_others(replica, now_s)
        if serves_others and not saturated:
            for index, earlier in enumerate(self.pending):
                repeated = earlier.replica.replica_id != replica.replica_id and earlier.kind is kind
                if (
                    repeated
                    and earlier.default is FailureCause.REPLICA  # it was no load when it happened
                    and self._serves_others(earlier.replica, now_s)
                    and self._shows_no_load(kind, (earlier.replica, replica), now_s)
                ):
                    del self.pending[index]
                    self.stalls.forget(self.key)
                    charges = (
                        Charge(earlier.replica, kind, FailureCause.REQUEST),
                        Charge(replica, kind, FailureCause.REQUEST),
                    )
                    return Verdict(charges, quarantine=True)
        default = FailureCause.LOAD if saturated else FailureCause.REPLICA
        if not serves_others:
            return self._now(replica, kind, default)
        self.pending.append(Pending(replica, pool, kind, now_s, default))
        return Verdict(pending=True)

    def settle(self, *, served: bool) -> tuple[Charge, ...]:
        """The request ended (`served`: another replica answered it). Each failure still pending is
        load's when it was load or there is load evidence now; else the request's when it was not served
        elsewhere and its replica delivered another response since; else the replica's. Once. With the
        fingerprint known, an unserved failure that is not load is also kept in `sighted`, and one that
        would be the replica's is not charged but kept in `held` (`resolve_held` decides it later)."""
        charges: list[Charge] = []
        for p in self.pending:
            cause = self._settled_cause(p, served)
            if self.fingerprint is not None and not served and cause is not FailureCause.LOAD:
                self.sighted.append(p)
                if cause is FailureCause.REPLICA:
                    self.held.append(p)
                    continue
            charges.append(Charge(p.replica, p.kind, cause))
        self.pending.clear()
        if any(c.kind is FailureKind.STREAM_IDLE and c.cause is FailureCause.REQUEST for c in charges):
            self.stalls.forget(self.key)
        return tuple(charges)

    def withdraw_last(self) -> Pending:
        """Take back the failure `record` just left pending (it turned out to be the request's)."""
        return self.pending.pop()

    def resolve_held(self, held: Pending, *, failed_elsewhere: bool) -> Charge:
        """The verdict on a held failure: load's on load evidence now; the request's when its fingerprint
        failed the same way on another replica or the replica delivered another response since; else the
        replica's."""
        if self._load(held.kind, held.replica, held.pool, self.clock.now_s()):
            return Charge(held.replica, held.kind, FailureCause.LOAD)
        if failed_elsewhere or _served_since(held):
            if held.kind is FailureKind.STREAM_IDLE:
                self.stalls.forget(self.key)
            return Charge(held.replica, held.kind, FailureCause.REQUEST)
        return Charge(held.replica, held.kind, held.default)

    def repeated_elsewhere(
        self, kind: FailureKind, replica: Replica, pool: Pool, elsewhere: Iterable[tuple[str, FailureKind]]
    ) -> bool:
        """Whether a failure of `kind` on `replica`, which keeps serving others, repeats one of this
        fingerprint's failures elsewhere (`elsewhere`: replica id and kind of each) as a poison request's
        would: the same kind on another replica that keeps serving others and is not down, and neither
        replica shows load for that kind (the rule of the second failure in one request)."""
        now_s = self.clock.now_s()
        for replica_id, seen in elsewhere:
            other = pool.replicas.get(replica_id)
            if seen is not kind or other is None or replica_id == replica.replica_id:
                continue
            if (
                self._serves_others(other, now_s)
                and not other.is_down(now_s)
                and self._shows_no_load(kind, (other, replica), now_s)
            ):
                return True
        return False

    def _settled_cause(self, pending: Pending, served: bool) -> FailureCause:
        if pending.default is FailureCause.LOAD:
            return FailureCause.LOAD
        if self._load(pending.kind, pending.replica, pending.pool, self.clock.now_s()):
            return FailureCause.LOAD  # the pool saturated while the request went on: load, not the replica
        if not served and _served_since(pending):
            return FailureCause.REQUEST
        return pending.default

    def _now(self, replica: Replica, kind: FailureKind | None, cause: FailureCause) -> Verdict:
        return Verdict((Charge(replica, kind, cause),))

    def _shows_no_load(self, kind: FailureKind, replicas: tuple[Replica, Replica], now_s: float) -> bool:
        """Neither replica shows load for this kind: for missed first tokens, each delivers most of its
        first tokens in time (below `SATURATED_MISS_RATIO` missed); for silent streams, neither engine
        is saturated and neither silenced another request's stream within the window."""
        if kind is FailureKind.TTFT_TIMEOUT:
            return all(self.outcomes.miss_ratio(r.replica_id, now_s) < SATURATED_MISS_RATIO for r in replicas)
        if kind is FailureKind.STREAM_IDLE:
            return not any(
                self._engine_saturated(r) or self.stalls.others(r.replica_id, now_s, self.key)
                for r in replicas
            )
        return True

    def _serves_others(self, replica: Replica, now_s: float) -> bool:
        last = replica.last_success_s
        return last is not None and now_s - last <= self.settings.window_s

    def _load(self, kind: FailureKind, replica: Replica, pool: Pool, now_s: float) -> bool:
        """Load evidence for a failure of `kind` on `replica` (module docstring); none for other kinds."""
        if kind is FailureKind.TTFT_TIMEOUT:
            return self._engine_saturated(replica) or self._misses_everywhere(pool, now_s)
        if kind is FailureKind.STREAM_IDLE:
            return self._engine_saturated(replica) or self._stalls_everywhere(replica, pool, now_s)
        return False

    def _engine_saturated(self, replica: Replica) -> bool:
        """The replica's engine reports a queue or a full KV cache (a fresh sample only)."""
        engine = replica.engine
        s = self.settings
        return (
            engine is not None
            and not engine.stale
            and (
                engine.waiting >= s.saturated_waiting_requests
                or engine.kv_usage_ratio >= s.saturated_kv_usage_ratio
            )
        )

    def _misses_everywhere(self, pool: Pool, now_s: float) -> bool:
        """Every routable replica misses most of its first-token deadlines."""
        routable = [r for r in pool.replicas.values() if r.routable_at(now_s)]
        return bool(routable) and all(
            self.outcomes.miss_ratio(r.replica_id, now_s) >= SATURATED_MISS_RATIO for r in routable
        )

    def _stalls_everywhere(self, replica: Replica, pool: Pool, now_s: float) -> bool:
        """Every other routable replica silenced another request's stream within the window (the
        failing one just silenced this one's; alone in its pool, that is everywhere)."""
        return all(
            self.stalls.others(r.replica_id, now_s, self.key)
            for r in pool.replicas.values()
            if r.replica_id != replica.replica_id and r.routable_at(now_s)
        )


def _served_since(pending: Pending) -> bool:
    last = pending.replica.last_success_s
    return last is not None and last > pending.failed_at_s


class PoolAttribution:
    """A pool's attribution settings and its pool-wide evidence (first-token outcomes and silent
    streams, by replica)."""

    def __init__(self, settings: AttributionSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._outcomes = FirstTokenOutcomes(settings.window_s)
        self._stalls = StallLog(settings.window_s)
        self._requests = count()

    def for_request(self) -> RequestFailures:
        """The failure record of one new request."""
        return RequestFailures(
            self._settings, self._clock, self._outcomes, self._stalls, next(self._requests)
        )

    def first_token_served(self, replica: Replica) -> None:
        """A try on `replica` got its first token in time (saturation evidence against)."""
        self._outcomes.record(replica.replica_id, self._clock.now_s(), missed=False)
