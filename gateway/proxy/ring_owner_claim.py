"""A ring keeps its key's owner through a learned cap: the claim of the key-routed policies.

`prefix-affinity` and `session-affinity` route on a key (the bounded ring, `router.bounded`): the
key's owner, or the next replica along the ring when the owner is not eligible. A learned cap
(`gateway.upstream.tpot_limit`) makes the owner ineligible whenever it is full, so under load the ring
moved its requests along — each a cold prefill on the next replica (a stall of every sequence decoding
there, which cuts that replica's cap in turn: spills fed the cuts that made the next spills) and a
second copy of the prefix in the fleet's caches (traced behind three gateway instances without shared
state: docs/bench-log/2026-12-06-ring-holds.md).

The rule (`claim_for_key`, admission's `try_dispatch` for these policies):

    routing would move the request off its key's owner, and the owner is
        routable and serving the model (`Profile.key_owner`),
        under the ring's bound over those replicas (`KeyOwner.under_bound`),
        under its learned cap's set point: its engine's last token-latency window is below it
        (`ReplicaCost.cap_has_room`), and
        full only by its learned cap: it has room at the cap × 1 / `tpot_target_ratio`
    → the owner takes it, within that headroom; else the move stands.

Why the set point: a cap binding while the engine's token latency is under it lags the batch (it
grows a step a window, and each spill's cold prefill cuts the replica it lands on); one binding at
the set point holds the objective. Stretched whatever the latency, past the knee the owners ran at the
headroom all the time, and the admitted requests' TPOT broke the objective.

The headroom is the one a waiter at its deadline may use (`PoolAdmission.try_at_deadline`): the set
point is `tpot_target_ratio` × the objective, so one sequence more at the owner costs its batch less
than the set point's margin, where the spill costs another replica a whole prefill. Not stretched: a
configured cap (`max_concurrency_per_replica`; the move stands), the ring's bound (an owner over it is
moved off as before), a request that finds no slot anywhere (it waits, as before: a stretch replaces a
spill, never a wait). A request held for its owner (`prefix_wait`) is decided first, as before.
Runs, with and without the set point's gate: docs/bench-log/2026-12-06-ring-owner-headroom.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from gateway.upstream.registry import Pool
from gateway.upstream.slot import Slot
from router.bounded import PREFIX_BRANCHES, SESSION_BRANCHES
from router.profile import Profile
from router.types import Decision, ReplicaView, RoutingRequest

MOVED = frozenset({PREFIX_BRANCHES.moved, SESSION_BRANCHES.moved})
"""The branches of a request moved along the ring (`spillover`, `session_break`): the only decisions
that look for the owner (a hit is the owner; no key or all over the bound has none to keep)."""


class Claims(Protocol):
    """The two halves of a pool's claim (`gateway.proxy.admit.PoolAdmission`)."""

    pool: Pool

    def decide(
        self, routing: RoutingRequest, views: tuple[ReplicaView, ...] | None = None
    ) -> Decision | None: ...

    def take(self, decision: Decision, routing: RoutingRequest) -> Slot: ...


def headroom_share(pool: Pool, share: float) -> float:
    """`share` of a learned cap stretched to the headroom the cap leaves below the objective: × 1 /
    `tpot_target_ratio` (a configured cap is not scaled by a share). Also a waiter's at its deadline
    (`PoolAdmission.try_at_deadline`)."""
    return share / pool.settings.latency_model.tpot_target_ratio


def room_at_deadline(pool: Pool, share: float, borrow: bool, now_s: float) -> Callable[[str], bool]:
    """Whether a replica of `pool` has a free slot now for a request of cap share `share` within the
    headroom (`headroom_share`) its last try at its queue deadline may use
    (`router.prefix_wait.QueueState.room_at_deadline`)."""
    stretched = headroom_share(pool, share)
    return lambda replica_id: pool.replicas[replica_id].view(now_s, stretched, borrow).has_free_slot


def keyed_policy(pool: Pool) -> Profile | None:
    """The pool's policy when it routes on a key (the rings: `prefix-affinity`, `session-affinity`)."""
    policy = pool.policy
    return policy if isinstance(policy, Profile) and policy.routes_on_key else None


def claim_for_key(
    claims: Claims, keyed: Profile, routing: RoutingRequest, views: tuple[ReplicaView, ...] | None
) -> Slot | None:
    """A slot for `routing` under the key-routed policy `keyed`, its owner kept through a learned cap
    (module docstring); None when no replica has a free slot."""
    decision = claims.decide(routing, views)
    if decision is None or decision.branch not in MOVED:
        return None if decision is None else claims.take(decision, routing)
    pool = claims.pool
    owner = keyed.key_owner(routing, views if views is not None else pool.views_for(routing))
    if (
        owner is not None
        and owner.replica_id != decision.replica_id
        and owner.under_bound
        and pool.replicas[owner.replica_id].cost.cap_has_room
    ):
        share = headroom_share(pool, routing.cap_share)
        others = frozenset(pool.replicas) - {owner.replica_id}
        stretched = claims.decide(replace(routing, cap_share=share, exclude=routing.exclude | others))
        if stretched is not None:
            return claims.take(stretched, routing)
    return claims.take(decision, routing)
