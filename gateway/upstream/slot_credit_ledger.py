"""The local ledger of replica slot credits: what one gateway instance holds per replica, and the limit
routing sees (`Replica.credit_limit`). Synchronous and clock-driven; the refiller that talks to the
lease store, and the rules themselves, are in `gateway.upstream.slot_credits` (its store link and the
contention between instances in `slot_credit_store_link` and `slot_credit_contention`).

Lease resource ids (`LeaseScope.REPLICA`; in Redis the key is `{prefix}lease:replica:{resource id}`):
- a replica's slots: `{model}@{host}:{port}` (`slot_resource_id`). The cap is per pool and per replica,
  as `max_concurrency_per_replica` is configured per pool and as memory state applies it (each pool has
  its own `Replica` and in-flight count): two pools that name the same engine address hold separate
  caps on it, each with its own limit, and never share or fight over one set of leases. An engine
  serving several models therefore takes up to the sum of their caps; set the caps for that. The id is
  built from the configuration only (model name, normalized `host:port`), so every instance derives
  the same one; a replica id never contains `@`, so the split at the last `@` is unambiguous;
- a pool's starving presence: `pool-demand/{model}` (`PoolCredits.presence_id`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from admission.leases import Lease
from core.clock import Clock
from gateway.upstream.registry import Pool
from gateway.upstream.replica import Replica

ACQUIRE_RETRY_INITIAL_S = 0.01
ACQUIRE_RETRY_MAX_S = 0.25
ACQUIRE_RETRY_BELOW_SHARE_MAX_S = 0.05
SHED_HOLDOFF_S = 0.3
PRESENCE_PREFIX = "pool-demand/"


def slot_resource_id(model: str, replica_id: str) -> str:
    """The lease resource holding the slots of `model`'s pool on replica `replica_id` (`host:port`):
    `{model}@{replica_id}`, one cap per pool and replica (module docstring)."""
    return f"{model}@{replica_id}"


class CreditOwner(Protocol):
    """What the ledger reads from the credits of the instance (`SlotCredits`)."""

    @property
    def mode(self) -> CreditMode:
        """What governs dispatch now."""
        ...

    @property
    def clock(self) -> Clock:
        """The instance's clock."""
        ...

    @property
    def linger_s(self) -> float:
        """How long idle and floating credits stay."""
        ...


class StateHealth(Protocol):
    """Whether shared state answers (`core.shared_state.RedisBackend` is one)."""

    @property
    def available(self) -> bool:
        """False from a failed call until the next successful one."""
        ...

    @property
    def fail_open(self) -> bool:
        """True when an unreachable store means allow."""
        ...


class CreditMode(StrEnum):
    """What governs dispatch to capped replicas."""

    SHARED = "shared"
    """Redis answers: credits."""
    LOCAL = "local"
    """Redis unreachable, `fail_open`: each instance's own cap."""
    CLOSED = "closed"
    """Redis unreachable, `fail_closed`: no new dispatch."""


@dataclass(eq=False, slots=True)
class HeldCredit:
    lease: Lease
    renew_at_s: float
    acquired_s: float = 0.0


class ReplicaCredits:
    """This instance's credits on one capped replica, and the limit its view carries."""

    def __init__(self, replica: Replica, pool: PoolCredits) -> None:
        assert replica.max_concurrency is not None
        self.replica = replica
        self.cap = replica.max_concurrency
        self.resource_id = slot_resource_id(pool.pool.model, replica.replica_id)
        self._pool = pool
        self.credits: list[HeldCredit] = []
        self.peak = 0
        self.retry_at_s = 0.0
        self.backoff_s = 0.0
        self.floating_after_s = 0.0

    @property
    def held(self) -> int:
        return len(self.credits)

    def limit(self) -> int:
        """How many requests this instance may have in flight on the replica (module docstring)."""
        mode = self._pool.owner.mode
        if mode is CreditMode.LOCAL:
            return self.cap
        if mode is CreditMode.CLOSED:
            return 0
        share = self._pool.share(self.cap)
        if share is None or share >= self.held:
            return self.held
        floating_since_s = self._pool.owner.clock.now_s() - self._pool.owner.linger_s
        young = any(held.acquired_s > floating_since_s for held in self.credits[share:])
        return share + (1 if young else 0)

    def floating_ends_s(self) -> list[float]:
        """When the floating credits stop being usable (contended only)."""
        share = self._pool.share(self.cap)
        if share is None:
            return []
        return [held.acquired_s + self._pool.owner.linger_s for held in self.credits[share:]]

    def usable_free(self) -> int:
        return max(0, self.limit() - self.replica.inflight_requests)

    def surplus(self) -> int:
        """Free credits above the limit: nobody may use them, they go back now."""
        return max(0, self.held - max(self.replica.inflight_requests, self.limit()))

    def wants_credit(self, now_s: float, demand: bool) -> bool:
        """Ask Redis for one more: room under the cap, no usable free credit, eligible, not backing off.
        Uncontended: for waiters, or as the spare. Contended: up to the share; one floating credit
        above it only for waiters and not within `SHED_HOLDOFF_S` of shedding one."""
        if self.held >= self.cap or self.retry_at_s > now_s or not self.replica.routable_at(now_s):
            return False
        if self.usable_free() > 0:
            return False
        share = self._pool.share(self.cap)
        if share is None or self.held < share:
            return True
        return demand and self.held == share and self.floating_after_s <= now_s

    def take(self, count: int) -> list[HeldCredit]:
        """Remove `count` credits (≤ the free ones) for release: floating ones past their linger
        first, then the youngest."""
        count = min(count, self.held - self.replica.inflight_requests)
        if count <= 0:
            return []
        share = self._pool.share(self.cap)
        since_s = self._pool.owner.clock.now_s() - self._pool.owner.linger_s
        expired = [] if share is None else [c for c in self.credits[share:] if c.acquired_s <= since_s]
        order = expired + [c for c in reversed(self.credits) if c not in expired]
        taken = order[:count]
        self.credits = [c for c in self.credits if c not in taken]
        return taken

    def refused(self, now_s: float) -> None:
        """Redis had no room: back off (less while below the share, so the instance that has the
        fewest credits is the likeliest to get the next one)."""
        share = self._pool.share(self.cap)
        ceiling_s = ACQUIRE_RETRY_MAX_S
        if share is not None and self.held < share:
            ceiling_s = ACQUIRE_RETRY_BELOW_SHARE_MAX_S
        self.backoff_s = min(ceiling_s, max(ACQUIRE_RETRY_INITIAL_S, self.backoff_s * 2))
        self.retry_at_s = now_s + self.backoff_s


class PoolCredits:
    """The credits of one pool, its demand (`waiting`) and how it is told about new ones. The demand is
    every queue that dispatches on the pool's replicas: the pool's own, and for a disaggregated pool's
    two sets also the pair queue (`add_demand`)."""

    def __init__(
        self, pool: Pool, owner: CreditOwner, waiting: Callable[[], int], on_credit: Callable[[], None]
    ) -> None:
        self.pool = pool
        self.owner = owner
        self._demands: list[tuple[Callable[[], int], Callable[[], None]]] = [(waiting, on_credit)]
        self.replicas: dict[str, ReplicaCredits] = {}
        self.others_starving = 0
        self.presence: HeldCredit | None = None
        self.starving = False
        self.checked_s = -math.inf
        self.last_dispatch_s = -math.inf
        self.last_waiting_s = -math.inf
        self.window_end_s = owner.clock.now_s() + owner.linger_s

    def add_demand(self, waiting: Callable[[], int], on_credit: Callable[[], None]) -> None:
        """Another queue dispatching on this pool's replicas: its waiters count, it hears of credits."""
        self._demands.append((waiting, on_credit))

    def waiting(self) -> int:
        """Requests queued for a slot on this pool's replicas, over every queue that dispatches there."""
        return sum(waiting() for waiting, _ in self._demands)

    def on_credit(self) -> None:
        """Credits arrived or the mode changed: every queue dispatching here looks again."""
        for _, on_credit in self._demands:
            on_credit()

    @property
    def presence_id(self) -> str:
        return PRESENCE_PREFIX + self.pool.model

    def share(self, cap: int) -> int | None:
        """Credits per instance when others starve; None when nobody else does."""
        if self.others_starving <= 0:
            return None
        return cap // (self.others_starving + 1)

    def held(self) -> int:
        return sum(rc.held for rc in self.replicas.values())

    def active(self, now_s: float) -> bool:
        return self.waiting() > 0 or now_s - self.last_dispatch_s < self.owner.linger_s

    def sync(self) -> None:
        """Govern every capped replica of the pool (discovery adds replicas at any time)."""
        for replica in self.pool.replicas.values():
            if replica.max_concurrency is None:
                continue
            rc = self.replicas.get(replica.replica_id)
            if rc is None:
                rc = self.replicas[replica.replica_id] = ReplicaCredits(replica, self)
            elif rc.replica is replica and replica.credit_limit is not None:
                continue
            rc.replica = replica  # new, or re-added under the same id: its credits carry over
            replica.credit_limit = rc.limit

    def detach_gone(self) -> list[HeldCredit]:
        """Credits of replicas no longer in the pool, for release."""
        gone = [rid for rid in self.replicas if rid not in self.pool.replicas]
        released: list[HeldCredit] = []
        for rid in gone:
            released += self.replicas.pop(rid).credits
        return released
