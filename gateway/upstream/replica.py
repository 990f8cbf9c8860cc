"""One replica's mutable state (requests are counted on it by `gateway.upstream.slot.Slot`).

Health has two sources, combined in `view()`:
- active: `active_up`, set by the health checker (thresholds in `HealthCheckSettings`);
- passive: a connect failure holds the replica out until `hold_until_s` with exponential backoff
  (1 s doubling per consecutive failure, up to 30 s); an engine's `Retry-After` holds it out for that
  long too. The first request after the hold is a probe; a success clears the backoff.
The circuit breaker is the third gate; `draining` the fourth (operator or discovery). Whether the
gates let traffic through is decided by `router.eligibility.is_routable` on the replica's view, the
same function routing runs.

Down and ejected are different things (the pool's ejection budget counts only the second):
- *down* (`is_down`): the active check says down, a passive hold runs, or its last attempt could not
  connect (until a request succeeds there) — a replica that refuses connections is down between its
  holds too;
- *ejected* (`is_ejected`): its breaker is OPEN or HALF_OPEN while it is neither down nor draining —
  out of rotation because of its answers alone.
While the pool is in panic (`panic`, set by the pool), the view ignores the breaker: an up,
non-draining replica is routable whatever its breaker says (`gateway.upstream.registry`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from gateway.upstream.breaker import CircuitBreaker
from gateway.upstream.engine_metrics.sample import EngineSample
from gateway.upstream.replica_cost import ReplicaCost
from router.eligibility import is_routable
from router.types import EngineLoad, ReplicaView

PASSIVE_BACKOFF_INITIAL_S = 1.0
PASSIVE_BACKOFF_MAX_S = 30.0


@dataclass(slots=True)
class Replica:
    """Mutable state of one replica in one pool. Mutated only by the registry, guards and checkers."""

    replica_id: str
    url: str
    model: str
    breaker: CircuitBreaker
    max_concurrency: int | None = None
    active_up: bool = True
    draining: bool = False
    """Drained by an operator (admin API)."""
    discovery_draining: bool = False
    """Drained by discovery (terminating endpoint, gone from DNS); in-flight requests finish."""
    remove_when_idle: bool = False
    """Gone from discovery while serving: removed from the pool when its last request ends."""
    inflight_requests: int = 0
    inflight_tokens: int = 0
    lowest_class_inflight: int = 0
    """Of `inflight_requests`, those of the lowest of several priority classes (`CapTier.LOWEST`): the
    place a request of the top class may take above a learned cap (`effective_max_concurrency`)."""
    foreign_lowest_class: int = 0
    """Lowest-class requests the other gateway instances run here, from shared state
    (`gateway.fleet.lowest_class_sharing`); 0 with memory state or Redis unreachable."""
    consecutive_connect_failures: int = 0
    hold_until_s: float = 0.0
    last_success_s: float | None = None
    """When this replica last delivered a whole response (`ReplicaRegistry.record_served`; failure
    attribution: a replica that keeps serving other requests is not the cause of one request's failure)."""
    engine: EngineLoad | None = None
    next_health_probe_s: float | None = field(default=None)
    credit_limit: Callable[[], int] | None = None
    """This instance's slot limit when the cap is shared across instances through Redis
    (`gateway.upstream.slot_credits`); None: `max_concurrency` alone."""
    panic: bool = False
    """The pool is in panic mode: routing ignores this replica's breaker (set by `Pool` only)."""
    cost: ReplicaCost = field(default_factory=ReplicaCost)
    """Token-aware load, the learned latency model and its cap (`gateway.upstream.replica_cost`)."""
    models: frozenset[str] | None = None
    """The client-facing names this replica serves, when its pool discovers them (`models.discover`:
    set by the pool, then by each read of its /v1/models); None: every name of the pool."""

    def healthy_at(self, now_s: float) -> bool:
        return self.active_up and now_s >= self.hold_until_s

    @property
    def is_draining(self) -> bool:
        return self.draining or self.discovery_draining

    def is_down(self, now_s: float) -> bool:
        """Down, not ejected (module docstring): active check, passive hold, or a connect-failure streak."""
        return not self.healthy_at(now_s) or self.consecutive_connect_failures > 0

    def is_ejected(self, now_s: float) -> bool:
        """Circuit-open (OPEN or HALF_OPEN) while neither down nor draining: what the budget counts."""
        return self.breaker.ejected and not self.is_draining and not self.is_down(now_s)

    def routable_at(self, now_s: float) -> bool:
        """May take traffic at all (health, drain and breaker gates — the breaker's ignored in panic):
        `router.eligibility.is_routable` on `view`."""
        return is_routable(self.view(now_s))

    def view(self, now_s: float, cap_share: float = 1.0, borrow: bool = False) -> ReplicaView:
        """This replica as routing sees it now, for a request whose class may fill `cap_share` of a
        learned cap (`RoutingRequest.cap_share`) and, with `borrow` (the top class), the place the
        lowest class holds under it."""
        return ReplicaView(
            replica_id=self.replica_id,
            url=self.url,
            healthy=self.healthy_at(now_s),
            draining=self.is_draining,
            breaker_open=not self.panic and not self.breaker.allows(),
            inflight_requests=self.inflight_requests,
            inflight_tokens=self.inflight_tokens,
            max_concurrency=self.effective_max_concurrency(cap_share, borrow),
            engine=self.engine,
            prefill_tokens_inflight=self.cost.prefill_tokens_inflight,
            decoding_requests=self.cost.decoding_requests,
            latency=self.cost.estimate,
            since_last_token_s=self.cost.since_last_token_s(),
            models=self.models,
        )

    def effective_max_concurrency(self, cap_share: float = 1.0, borrow: bool = False) -> int | None:
        """The cap routing applies to this instance's in-flight requests: `max_concurrency`, or the
        learned cap when one is set (never above `max_concurrency`), lowered to this instance's credits
        when shared. A learned cap fed by the engine's token latency is on the engine's whole batch, so
        the requests other senders run there (`ReplicaCost.foreign_requests`) come off it first.
        `cap_share` (a priority class's, ≤ 1: `admission.lowest_class_reserve`; above 1 for a waiter at
        its deadline: `PoolAdmission.try_at_deadline`) scales the learned cap to
        max(1, ⌊learned × cap_share⌋) before the rest; a cap without a learned one is not scaled.
        `borrow` (a top-class request: `admission.lowest_class_reserve`, "The top class") adds the
        lowest class's requests running here (`lowest_class_inflight`, and with shared state the other
        instances' `foreign_lowest_class`, at most their requests subtracted above) to a learned cap:
        the top class takes their place. A configured cap and shared credits still bound it (the
        credits' lease cap in Redis bounds the sum over instances; `fail_closed` with Redis down admits
        nothing)."""
        cost = self.cost
        learned = cost.learned_cap
        if learned is None:
            cap = self.max_concurrency
        else:
            if cap_share != 1.0 and learned > 1:
                learned = max(1, math.floor(learned * cap_share))
            foreign = math.ceil(cost.foreign_requests) if cost.windowed else 0
            lent = self.lowest_class_inflight + min(self.foreign_lowest_class, foreign) if borrow else 0
            learned = max(0, learned - foreign + lent)
            cap = learned if self.max_concurrency is None else min(learned, self.max_concurrency)
        if self.credit_limit is None or cap is None:
            return cap
        return min(cap, self.credit_limit())

    @property
    def learned_cap(self) -> int | None:
        """The learned cap on the engine (`ReplicaCost.learned_cap`), None while there is none."""
        return self.cost.learned_cap

    @property
    def learned_cap_set_point_s(self) -> float | None:
        """The token latency the learned cap steers to (`ReplicaCost.cap_set_point_s`)."""
        return self.cost.cap_set_point_s

    @property
    def learned_cap_held_near_floor(self) -> bool:
        """The learned cap near its floor, the latency over its set point (`ReplicaCost`)."""
        return self.cost.cap_held_near_floor

    def engine_sampled(self, sample: EngineSample | None) -> bool:
        """The scraper's word: a fresh sample (its token latency and batch teach the learned cap), or
        None when the engine's samples went stale. True when this instance's cap grew (admission
        should look at its waiters again)."""
        before = self.effective_max_concurrency()
        if sample is None:
            self.cost.engine_lost()
        else:
            batch = sample.running + sample.waiting
            self.cost.engine_sampled(sample.token_latency_s, batch, self.inflight_requests)
        after = self.effective_max_concurrency()
        if after is None:
            return before is not None
        return before is not None and after > before

    def routable_ignoring_panic(self, now_s: float) -> bool:
        """Healthy, not draining, breaker letting traffic through: what panic mode's threshold counts."""
        return self.healthy_at(now_s) and not self.is_draining and self.breaker.allows()

    def seconds_until_eligible(self, now_s: float) -> float | None:
        """When this replica may take traffic again by itself (None: only an operator can say)."""
        if self.is_draining:
            return None
        waits = [max(0.0, self.hold_until_s - now_s), self.breaker.seconds_until_probe()]
        if not self.active_up:
            if self.next_health_probe_s is None:
                return None
            waits.append(max(0.0, self.next_health_probe_s - now_s))
        return max(waits)


class ReplicaCondition(StrEnum):
    """A replica's state for the `llm_gateway_replicas{pool,state}` gauge (first that applies)."""

    DRAINING = "draining"
    DOWN = "down"
    BREAKER_OPEN = "breaker_open"
    READY = "ready"


def condition_of(replica: Replica, now_s: float) -> ReplicaCondition:
    """The first condition that applies to `replica` at `now_s`."""
    if replica.is_draining:
        return ReplicaCondition.DRAINING
    if not replica.healthy_at(now_s):
        return ReplicaCondition.DOWN
    if not replica.breaker.allows():
        return ReplicaCondition.BREAKER_OPEN
    return ReplicaCondition.READY
