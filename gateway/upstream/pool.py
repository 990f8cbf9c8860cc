"""One pool: the replicas serving one client-facing model (and the other names they serve), its routing
policy, and the two pool-wide rules that keep breakers from turning bad requests or an overload into a
fleet outage — the ejection budget and panic mode (described in `gateway.upstream.registry`, which
owns every pool and is the only writer of replica state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from admission.retry_after import no_replica_retry_after_s
from core.clock import Clock
from gateway.config.settings import PoolSettings
from gateway.upstream.breaker import BreakerPolicy, CircuitBreaker, ejection_budget
from gateway.upstream.replica import Replica
from gateway.upstream.replica_cost import ReplicaCost
from router.eligibility import any_routable
from router.keys import KeySettings
from router.profile import Policy
from router.types import ReplicaView, RoutingRequest

logger = logging.getLogger(__name__)


def replica_id_for(url: str) -> str:
    """A stable, label-safe id for a replica URL: `host:port`."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def breaker_policy(settings: PoolSettings) -> BreakerPolicy:
    b = settings.breaker
    return BreakerPolicy(
        b.consecutive_failures, b.failure_ratio, b.min_requests, b.window_s, b.open_s, b.max_open_s
    )


class Pool:
    """The replicas serving one client-facing model, the routing policy over them, and the pool-wide
    ejection budget and panic mode (module docstring)."""

    def __init__(
        self,
        settings: PoolSettings,
        policy: Policy,
        clock: Clock,
        on_panic_change: Callable[[Pool], None] | None = None,
    ) -> None:
        self.settings = settings
        self.policy = policy
        self.prefill: Pool | None = None  # a disaggregated pool's prefill set (this one is its decode set)
        self.client_facing = True  # False for a prefill set: never asked for by name
        self.key_settings = KeySettings.from_options(settings.policy_options)
        self._clock = clock
        self._on_panic_change = on_panic_change
        self.panic = False
        """Panic mode as last evaluated (`in_panic`, `snapshot`): routing ignores breakers."""
        self.replicas: dict[str, Replica] = {}
        self.declared_models = frozenset({settings.model, *settings.models.names})
        self.loadable_models = frozenset(settings.models.adapters)
        """Adapters the gateway may load onto a replica at run time (`gateway.proxy.adapter_loading`)."""
        """The names every replica is taken to serve until its /v1/models says otherwise."""
        self.discovered_models: frozenset[str] = frozenset()
        """Names only some replicas serve, learned from their /v1/models (`models.discover`)."""
        for url in settings.replicas.static:
            self.add_replica(url)

    @property
    def model(self) -> str:
        return self.settings.model

    def add_replica(self, url: str) -> Replica:
        rid = replica_id_for(url)
        breaker = CircuitBreaker(
            breaker_policy(self.settings), self._clock.now_s, may_open=lambda: self._may_eject(rid)
        )
        cap = self.settings.max_concurrency_per_replica
        replica = Replica(rid, url, self.model, breaker, cap)
        replica.cost = ReplicaCost(
            self.settings.latency_model,
            tpot_slo_s=self.settings.slo.tpot_s,
            configured_cap=cap,
            clock=self._clock,
        )
        replica.panic = self.panic
        if self.settings.models.discover:
            replica.models = self.declared_models
        self.replicas[rid] = replica
        return replica

    def set_replica_models(self, replica: Replica, models: frozenset[str]) -> bool:
        """What `replica` serves now (its /v1/models, read by `gateway.upstream.model_discovery`);
        True when the pool's names changed."""
        replica.models = models
        return self.recount_models()

    def recount_models(self) -> bool:
        """Recompute `discovered_models` from the replicas; True when it changed."""
        learned: set[str] = set()
        for replica in self.replicas.values():
            if replica.models is not None:
                learned |= replica.models
        discovered = frozenset(learned - self.declared_models)
        changed = discovered != self.discovered_models
        self.discovered_models = discovered
        return changed

    def ejection_budget(self) -> int:
        """How many replicas may be ejected at once (module docstring), n = every replica of the pool."""
        return ejection_budget(len(self.replicas), self.settings.breaker.max_ejected_ratio)

    def ejected_count(self) -> int:
        """Replicas ejected now (`Replica.is_ejected`: circuit-open, neither down nor draining)."""
        now_s = self._clock.now_s()
        return sum(1 for r in self.replicas.values() if r.is_ejected(now_s))

    def _may_eject(self, replica_id: str) -> bool:
        """The breaker of `replica_id` may open: it would not be ejected (down or draining: no budget
        used), or the others leave room in the budget."""
        replica = self.replicas.get(replica_id)
        now_s = self._clock.now_s()
        if replica is None or replica.is_draining or replica.is_down(now_s):
            return True
        others = sum(1 for r in self.replicas.values() if r is not replica and r.is_ejected(now_s))
        return others < self.ejection_budget()

    def in_panic(self) -> bool:
        """Evaluate panic mode now: fewer than `panic_threshold` × (non-draining replicas) routable.
        On a change, every replica's `panic` flag follows, a warning is logged and the registry told."""
        return self._evaluate_panic(self._clock.now_s())

    def _evaluate_panic(self, now_s: float) -> bool:
        serving = routable = 0  # one plain loop: this runs on every snapshot, twice per request
        for r in self.replicas.values():
            if not r.is_draining:
                serving += 1
                if r.routable_ignoring_panic(now_s):
                    routable += 1
        threshold = self.settings.breaker.panic_threshold
        panic = routable < threshold * serving
        if panic != self.panic:
            self.panic = panic
            for replica in self.replicas.values():
                replica.panic = panic
            logger.warning(
                "pool %s %s panic mode: %d of %d non-draining replicas routable (threshold %.2f)%s",
                self.model,
                "enters" if panic else "leaves",
                routable,
                serving,
                threshold,
                "; routing ignores breakers" if panic else "",
            )
            if self._on_panic_change is not None:
                self._on_panic_change(self)
        return panic

    def snapshot(self, cap_share: float = 1.0, borrow: bool = False) -> tuple[ReplicaView, ...]:
        """Frozen views for one routing decision (panic mode evaluated first: in panic, the views of up,
        non-draining replicas say their breaker is not open); `cap_share`: the request's class's
        share of a learned cap, `borrow`: it may take the lowest class's place there (`Replica.view`)."""
        now_s = self._clock.now_s()
        self._evaluate_panic(now_s)
        return tuple(r.view(now_s, cap_share, borrow) for r in self.replicas.values())

    def views_for(self, routing: RoutingRequest) -> tuple[ReplicaView, ...]:
        """`snapshot` for `routing`'s class: its cap share, and the top class's borrow."""
        return self.snapshot(routing.cap_share, routing.borrows_lowest_place)

    def has_eligible_replica(self, model: str | None = None) -> bool:
        """At least one replica may take traffic (`router.eligibility.any_routable`, panic included: in
        panic an up, non-draining replica with an open breaker is eligible) — with `model`, one serving
        that name; else `no_replica`."""
        return any_routable(self.snapshot(), model)

    def retry_after_s(self, model: str | None = None) -> int:
        """`Retry-After` for `no_replica`: the soonest timer that can bring an ineligible replica (of
        those serving `model`, when given) back."""
        now_s = self._clock.now_s()
        timers = (
            r.seconds_until_eligible(now_s)
            for r in self.replicas.values()
            if not r.routable_at(now_s) and (model is None or r.models is None or model in r.models)
        )
        return no_replica_retry_after_s(timers)
