"""The one place where mutable replica state lives; policies only ever see frozen `ReplicaView`s.

Load accounting is a `Slot` per request and replica (`gateway.upstream.slot`): claimed when routing
has chosen the replica, held by the request's admission `Ticket`, released exactly once on every path.
Outcomes reported by the proxy feed passive health, the circuit breakers and the metrics; release
listeners (the admission pumps, which schedule themselves; the slot-credit refiller) are told whenever
a slot frees up or capacity may have grown.

Two pool-wide rules keep breakers from turning bad requests or an overload into a fleet outage
(Envoy's outlier detection; `BreakerSettings`; formulas and edge cases in docs/RELIABILITY.md):
- **ejection budget**: at most `ejection_budget(n, max_ejected_ratio)` replicas ejected at once
  (`Replica.is_ejected`: breaker open or half-open, neither down nor draining; n = every replica of the
  pool). A breaker that would open beyond it stays closed and keeps counting (`Pool._may_eject`, its
  injected `may_open`); each refusal counts in `ejections_refused_total{model}`.
- **panic mode**: when fewer than `panic_threshold` × (non-draining replicas) are routable, the pool's
  views ignore breakers (`Replica.panic`): routing and `has_eligible_replica` spread over every up,
  non-draining replica. Evaluated at every snapshot and replica state change (`pool_panic{model}`, a
  warning on entering and leaving); decisions made in panic count in `panic_decisions_total{model}`
  when their slot is claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterator

from core.clock import Clock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import ConfigError, PoolSettings, Settings
from gateway.upstream.breaker import (
    BREAKER_STATE_VALUE,
    FailureEffect,
)
from gateway.upstream.discovery.membership import plan_membership
from gateway.upstream.discovery.types import ReplicaSet
from gateway.upstream.failure_kinds import BREAKER_FAILURES, FailureKind
from gateway.upstream.pool import Pool, breaker_policy, replica_id_for
from gateway.upstream.prefill_set import prefill_set_settings
from gateway.upstream.replica import (
    PASSIVE_BACKOFF_INITIAL_S,
    PASSIVE_BACKOFF_MAX_S,
    Replica,
    ReplicaCondition,
    condition_of,
)
from gateway.upstream.slot import ReplicaGauges, Slot
from router.presets import PolicyContext, build_policy
from router.types import Decision

logger = logging.getLogger(__name__)

__all__ = [
    "Pool",
    "ReplicaRegistry",
    "breaker_policy",
    "replica_id_for",
]


class ReplicaRegistry:
    """All pools by model name; the only writer of replica state."""

    def __init__(self, settings: Settings, metrics: GatewayMetrics, clock: Clock, rng: random.Random) -> None:
        self._metrics = metrics
        self._clock = clock
        self.pools: dict[str, Pool] = {}
        self._total_inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._release_listeners: list[Callable[[], None]] = []
        self._gauges: dict[str, ReplicaGauges] = {}
        """Each replica's slot gauges, resolved at its first claim (dropped when it leaves)."""
        for pool_settings in settings.pools:
            pool = self._add_pool(pool_settings, rng)
            if pool_settings.disaggregation is not None:
                pool.prefill = self._add_pool(prefill_set_settings(pool_settings), rng)
                pool.prefill.client_facing = False
        for replica in self.all_replicas():
            self._publish(replica)

    def _add_pool(self, pool_settings: PoolSettings, rng: random.Random) -> Pool:
        if pool_settings.model in self.pools:
            raise ConfigError(f"pools: model {pool_settings.model!r} names two pools (or a prefill set)")
        options, profile = pool_settings.policy_options, pool_settings.profile
        ctx = PolicyContext(rng=random.Random(rng.random()), options=options, profile=profile)
        policy = build_policy(pool_settings.policy, ctx)
        pool = self.pools[pool_settings.model] = Pool(
            pool_settings, policy, clock=self._clock, on_panic_change=self._publish_panic
        )
        self._metrics.pool_panic.labels(pool_settings.model).set(0)
        return pool

    def pool(self, model: str) -> Pool | None:
        """The client-facing pool serving `model` (never a prefill set), or None."""
        pool = self.pools.get(model)
        return pool if pool is not None and pool.client_facing else None

    def all_replicas(self) -> Iterator[Replica]:
        for pool in self.pools.values():
            yield from pool.replicas.values()

    def find(self, replica_id: str) -> list[Replica]:
        return [r for r in self.all_replicas() if r.replica_id == replica_id]

    def add_release_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after every guard release (admission uses it to dispatch waiters)."""
        self._release_listeners.append(listener)

    def claim(
        self,
        replica: Replica,
        decision: Decision,
        tokens: int,
        uncached_tokens: int = 0,
        *,
        prompt_tokens: int | None = None,
        affinity_tokens: int | None = None,
        lowest_class: bool = False,
    ) -> Slot:
        """Count one request of `tokens` estimated tokens (`prompt_tokens` of its prompt and
        `affinity_tokens` of those held by some replicas of the pool and not others, when known;
        `lowest_class`: of the lowest of several priority classes), `uncached_tokens` of them left to
        prefill, on
        `replica` (chosen by `decision`; a decision made in panic mode — over the pool's last snapshot
        — is counted in `panic_decisions_total`)."""
        if replica.panic:
            self._metrics.panic_decisions_total.labels(replica.model).inc()
        self._total_inflight += 1
        self._idle.clear()
        gauges = self._gauges.get(replica.replica_id)
        if gauges is None:
            gauges = self._gauges[replica.replica_id] = ReplicaGauges(self._metrics, replica.replica_id)
        return Slot(
            replica,
            decision,
            tokens,
            gauges,
            self._released_one,
            clock=self._clock,
            uncached_tokens=uncached_tokens,
            prompt_tokens=prompt_tokens,
            affinity_tokens=affinity_tokens,
            lowest_class=lowest_class,
        )

    def _released_one(self, replica: Replica) -> None:
        self._total_inflight -= 1
        if self._total_inflight == 0:
            self._idle.set()
        if replica.remove_when_idle and replica.inflight_requests == 0:
            self._remove(self.pools[replica.model], replica)
        for listener in self._release_listeners:
            listener()

    async def wait_idle(self) -> None:
        """Return once no request holds a replica (used by the shutdown drain)."""
        await self._idle.wait()

    def total_inflight(self) -> int:
        return self._total_inflight

    def record_served(self, replica: Replica) -> None:
        """`replica` delivered a whole response (the evidence failure attribution reads: a replica that
        keeps serving other requests is not the cause of one request's repeated failure)."""
        replica.last_success_s = self._clock.now_s()

    def record_success(self, replica: Replica) -> None:
        """The replica answered (response headers): passive health and the breaker count a success."""
        state_before = replica.breaker.state
        replica.breaker.record_success()
        if replica.breaker.state is not state_before:
            self._metrics.breaker_transitions_total.labels(
                replica.replica_id, str(replica.breaker.state)
            ).inc()
        if replica.consecutive_connect_failures or replica.breaker.state is not state_before:
            replica.consecutive_connect_failures = 0
            self._publish(replica)

    def record_failure(self, replica: Replica, kind: FailureKind, retry_after_s: float | None = None) -> None:
        """Passive health and breaker accounting for a failed attempt (see `gateway.upstream.replica`)."""
        now_s = self._clock.now_s()
        if kind is FailureKind.CONNECT:
            replica.consecutive_connect_failures += 1
            backoff_s = PASSIVE_BACKOFF_INITIAL_S * 2 ** (replica.consecutive_connect_failures - 1)
            replica.hold_until_s = now_s + min(PASSIVE_BACKOFF_MAX_S, backoff_s)
        if retry_after_s is not None and retry_after_s > 0:
            replica.hold_until_s = max(
                replica.hold_until_s, now_s + min(retry_after_s, PASSIVE_BACKOFF_MAX_S)
            )
        effect = replica.breaker.record_failure() if kind in BREAKER_FAILURES else FailureEffect.COUNTED
        if effect is FailureEffect.TRIP_REFUSED:
            self._metrics.ejections_refused_total.labels(replica.model).inc()
        elif effect in (FailureEffect.OPENED, FailureEffect.REOPENED):
            self._metrics.breaker_transitions_total.labels(replica.replica_id, "open").inc()
        self._publish(replica)

    def set_active_health(self, replica: Replica, up: bool, next_probe_s: float | None) -> None:
        replica.active_up = up
        replica.next_health_probe_s = next_probe_s
        self._publish(replica)

    def set_replica_models(self, pool: Pool, replica: Replica, models: frozenset[str]) -> None:
        """What `replica` serves now (`gateway.upstream.model_discovery`). A change of its list may
        let queued requests for a name dispatch (or refuse them, `no_replica`, when nobody serves it
        any more): admission is told; a change of the pool's names is logged."""
        if models == replica.models:
            return
        if pool.set_replica_models(replica, models):
            logger.info(
                "pool %s serves %s",
                pool.model,
                ", ".join(sorted(pool.declared_models | pool.discovered_models)),
            )
        self._metrics.replica_models.labels(replica.replica_id).set(len(models))
        self.notify_capacity()

    def set_draining(self, replica: Replica, draining: bool) -> None:
        replica.draining = draining
        self._publish(replica)
        self.notify_capacity()

    def apply_membership(self, pool: Pool, target: ReplicaSet) -> None:
        """Apply one discovery event (see `gateway.upstream.discovery.membership`), synchronously."""
        by_url = {r.url: r for r in pool.replicas.values()}
        known = {url: r.inflight_requests for url, r in by_url.items()}
        draining = frozenset(url for url, r in by_url.items() if r.discovery_draining)
        plan = plan_membership(known, target, draining)
        for url in plan.add:
            self._publish(pool.add_replica(url))
        for url in plan.mark_ready:
            by_url[url].discovery_draining = False
            self._publish(by_url[url])
        for url in plan.mark_draining:
            by_url[url].discovery_draining = True
            self._publish(by_url[url])
        for url in plan.remove_when_idle:
            by_url[url].remove_when_idle = True
        for url in plan.remove:
            self._remove(pool, by_url[url])
        if plan.changed:
            logger.info("pool %s membership: %s", pool.model, plan)
            self.notify_capacity()

    def _remove(self, pool: Pool, replica: Replica) -> None:
        pool.replicas.pop(replica.replica_id, None)
        pool.recount_models()  # its adapters leave the pool with it
        rid = replica.replica_id
        self._gauges.pop(rid, None)
        for family in (
            self._metrics.inflight,
            self._metrics.replica_up,
            self._metrics.breaker_state,
            self._metrics.replica_draining,
            self._metrics.replica_models,
            self._metrics.learned_max_concurrency,
            self._metrics.learned_cap_set_point_seconds,
            self._metrics.learned_cap_held_at_floor,
        ):
            with contextlib.suppress(KeyError):
                family.remove(rid)
        for state in ("open", "closed"):
            with contextlib.suppress(KeyError):
                self._metrics.breaker_transitions_total.remove(rid, state)
        self._count_states(pool)

    def notify_capacity(self) -> None:
        """Capacity may have grown (a replica joined or came back, a learned cap grew): let admission
        dispatch waiters."""
        for listener in self._release_listeners:
            listener()

    def _count_states(self, pool: Pool) -> None:
        now_s = self._clock.now_s()
        counts = dict.fromkeys(ReplicaCondition, 0)
        for replica in pool.replicas.values():
            counts[condition_of(replica, now_s)] += 1
        for condition, count in counts.items():
            self._metrics.replicas.labels(pool.model, condition).set(count)
        pool.in_panic()

    def _publish_panic(self, pool: Pool) -> None:
        self._metrics.pool_panic.labels(pool.model).set(1 if pool.panic else 0)
        if pool.panic:
            self.notify_capacity()  # circuit-open replicas just became routable: dispatch waiters

    def _publish(self, replica: Replica) -> None:
        pool = self.pools.get(replica.model)
        if pool is not None:
            self._count_states(pool)
        labels = replica.replica_id
        self._metrics.replica_up.labels(labels).set(1 if replica.healthy_at(self._clock.now_s()) else 0)
        self._metrics.breaker_state.labels(labels).set(BREAKER_STATE_VALUE[replica.breaker.state])
        self._metrics.replica_draining.labels(labels).set(1 if replica.is_draining else 0)
