"""Pure, synchronous routing: replica snapshots in, a `Decision` with a branch reason out.

Nothing in this package does I/O, awaits, or imports a framework (stdlib and xxhash only), so every
policy is a deterministic function of (request, snapshot, injected RNG) and is tested without servers.
"""

from router.types import (
    Branch,
    Decision,
    EngineLoad,
    ReplicaView,
    RoutingRequest,
)

__all__ = ["Branch", "Decision", "EngineLoad", "ReplicaView", "RoutingRequest"]
