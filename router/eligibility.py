"""The single definition of "eligible": the one filter every policy runs first.

Two questions, answered here only:
- `is_routable(replica)`: may the replica take traffic at all? Healthy (active checks and passive
  hold), not draining, circuit breaker not open. The gateway asks it for readiness, `/v1/models`, the
  admin view and the `no_replica` decision (through `ReplicaView`s of its registry).
- `is_eligible(replica, request)`: may routing send *this* request there now? Routable, serving the
  request's model (a LoRA adapter lives on some replicas only: `ReplicaView.serves`), not already
  failed by this request (`exclude`, retries), and under its concurrency cap (`max_concurrency`, the
  latency barrier B_max: a request that finds every replica at its cap waits in the admission queue
  and is routed when a slot frees).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from router.types import ReplicaView, RoutingRequest


def is_routable(replica: ReplicaView) -> bool:
    """True when `replica` may take traffic at all: healthy, not draining, breaker not open."""
    return replica.healthy and not replica.draining and not replica.breaker_open


def is_eligible(replica: ReplicaView, request: RoutingRequest) -> bool:
    """True when routing may send `request` to `replica`."""
    return (
        is_routable(replica)
        and replica.serves(request.model)
        and replica.replica_id not in request.exclude
        and replica.has_free_slot
    )


def any_routable(replicas: Iterable[ReplicaView], model: str | None = None) -> bool:
    """True when at least one replica may take traffic (else the pool answers `no_replica`); with
    `model`, one that also serves it."""
    return any(is_routable(r) and (model is None or r.serves(model)) for r in replicas)


def eligible_replicas(request: RoutingRequest, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """The eligible subset of `replicas`, in their given order."""
    return [r for r in replicas if is_eligible(r, request)]
