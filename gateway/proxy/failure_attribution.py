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
  sending to a third replica (`gateway.proxy.quarantine`). "Shows load", per kind: missed first tokens,
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

Each charged failure is counted as `llm_gateway_upstream_failures_total{model,cause,kind}` (kind:
connect, status_5xx, overloaded, ttft_timeout, stream_idle, stream_broken, none).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import count

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


class StallLog:
    """Each replica's recent silent streams (idle timeouts) over a sliding window, by request, so a
    request's own stalls can be told from others'. A healthy replica silences no stream at all, so one
    stall of another request in the window is evidence (a count, not a ratio over few streams)."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._by_replica: dict[str, deque[tuple[float, int]]] = {}

    def record(self, replica_id: str, now_s: float, request: int) -> None:
        stalls = self._by_replica.setdefault(replica_id, deque())
        stalls.append((now_s, request))
        self._prune(stalls, now_s)

    def others(self, replica_id: str, now_s: float, request: int) -> int:
        """Stalls of requests other than `request` on the replica within the window."""
        stalls = self._by_replica.get(replica_id)
        if not stalls:
            return 0
        self._prune(stalls, now_s)
        return sum(1 for _, by in stalls if by != request)

    def forget(self, request: int) -> None:
        """Drop `request`'s stalls: they were charged to it (a poison request), so they are no evidence
        of load against the next one."""
        for replica_id, stalls in self._by_replica.items():
            self._by_replica[replica_id] = deque(stall for stall in stalls if stall[1] != request)

    def _prune(self, stalls: deque[tuple[float, int]], now_s: float) -> None:
        while stalls and now_s - stalls[0][0] > self._window_s:
            stalls.popleft()


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
    stalls: StallLog
    request: int
    """This request's number in its pool (tells its stalls from others' in `stalls`)."""
    pending: list[_Pending] = field(default_factory=list)

    def record(self, kind: FailureKind | None, replica: Replica, pool: Pool) -> Verdict:
        """Classify one failed attempt on `replica` (`kind`: `retry_policy.failure_kind` of the error)."""
        now_s = self.clock.now_s()
        if kind is FailureKind.TTFT_TIMEOUT:
            self.outcomes.record(replica.replica_id, now_s, missed=True)
        elif kind is FailureKind.STREAM_IDLE:
            self.stalls.record(replica.replica_id, now_s, self.request)
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
                    self.stalls.forget(self.request)
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
        """The request ended (`served`: another replica answered it). Each failure still pending is
        load's when it was load or there is load evidence now; else the request's when it was not served
        elsewhere and its replica delivered another response since; else the replica's. Once."""
        charges = tuple(Charge(p.replica, p.kind, self._settled_cause(p, served)) for p in self.pending)
        self.pending.clear()
        if any(c.kind is FailureKind.STREAM_IDLE and c.cause is FailureCause.REQUEST for c in charges):
            self.stalls.forget(self.request)
        return charges

    def _settled_cause(self, pending: _Pending, served: bool) -> FailureCause:
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
                self._engine_saturated(r) or self.stalls.others(r.replica_id, now_s, self.request)
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
            self.stalls.others(r.replica_id, now_s, self.request)
            for r in pool.replicas.values()
            if r.replica_id != replica.replica_id and r.routable_at(now_s)
        )


def _served_since(pending: _Pending) -> bool:
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
