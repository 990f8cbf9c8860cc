"""How the registry applies a `ReplicaSet`: a pure plan from (known replicas + in-flight) and the target.

The registry owns replica state; discovery only states what should exist. For each emitted set the
registry calls `plan_membership(known, target)` with `known` = URL → in-flight requests of the pool's
current replicas and applies the whole plan synchronously (one event, one consistent new state):

| replica | plan | registry does |
|---|---|---|
| new, `ready` | `add` | create it, eligible |
| new, `draining` | (ignored) | nothing: it would get no requests anyway |
| known, `ready` | `mark_ready` | clear the discovery-draining flag |
| known, `draining` | `mark_draining` | set the flag: no new requests, in-flight finish |
| known, absent, in-flight > 0 | `mark_draining` | same, and drop it when its last guard releases |
| known, absent, in-flight == 0 | `remove` | drop it (and its per-replica metric series) |

An operator's drain (admin API) is a separate flag: discovery saying `ready` never undoes it.

Ring rebuilds: the routing ring's membership is the pool's whole replica set, eligible or not
(`router.ring.RingCache` rebuilds when the id set changes). So `add`/`remove` rebuild it once per event
however many replicas changed, a replica dropped later when idle rebuilds it then, and draining does
not rebuild it at all: the keys of a draining replica walk on to the next replica on the ring, the same
one they land on once it is removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.upstream.discovery.types import ReplicaSet, ReplicaState


@dataclass(frozen=True, slots=True)
class MembershipPlan:
    add: frozenset[str] = frozenset()
    mark_ready: frozenset[str] = frozenset()
    mark_draining: frozenset[str] = frozenset()
    remove: frozenset[str] = frozenset()
    remove_when_idle: frozenset[str] = frozenset()
    """Absent from the source but still serving requests: drop each when its in-flight count reaches 0."""

    @property
    def changed(self) -> bool:
        """Whether applying the plan changes anything the router sees (membership or eligibility)."""
        return bool(self.add or self.remove or self.mark_ready or self.mark_draining)

    @property
    def membership_changed(self) -> bool:
        """Whether the pool's replica set changes now (the ring is rebuilt once, on the next decision)."""
        return bool(self.add or self.remove)


def plan_membership(
    known: Mapping[str, int], target: ReplicaSet, draining: frozenset[str] = frozenset()
) -> MembershipPlan:
    """Plan the move from `known` (URL → in-flight requests) to `target` (module docstring).

    `draining` is the subset of `known` already marked draining by discovery, so that repeated sets
    produce an empty plan: `mark_ready`/`mark_draining` list only real transitions.
    """
    add = frozenset(url for url, s in target.items() if url not in known and s is ReplicaState.READY)
    mark_ready = frozenset(url for url in known if target.get(url) is ReplicaState.READY and url in draining)
    absent = [url for url in known if url not in target]
    remove = frozenset(url for url in absent if known[url] <= 0)
    remove_when_idle = frozenset(url for url in absent if known[url] > 0)
    now_draining = {url for url in known if target.get(url) is ReplicaState.DRAINING} | remove_when_idle
    mark_draining = frozenset(now_draining - draining)
    return MembershipPlan(add, mark_ready, mark_draining, remove, remove_when_idle)
