"""The single definition of "eligible": the one filter every policy runs first.

A replica is eligible when it is healthy, not draining, its circuit breaker is not open, it has not
already failed this request, and it is under its concurrency cap (`max_concurrency`, the latency
barrier B_max: a request that finds every replica at its cap waits in the admission queue and is routed
when a slot frees). Nothing else in the code base decides this.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.types import ReplicaView, RoutingRequest


def is_eligible(replica: ReplicaView, request: RoutingRequest) -> bool:
    """True when routing may send `request` to `replica`."""
    return (
        replica.healthy
        and not replica.draining
        and not replica.breaker_open
        and replica.replica_id not in request.exclude
        and replica.has_free_slot
    )


def eligible_replicas(request: RoutingRequest, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """The eligible subset of `replicas`, in their given order."""
    return [r for r in replicas if is_eligible(r, request)]
