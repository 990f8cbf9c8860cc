"""How loaded a replica is, in the units a policy asks for.

`request_load` is the gateway's own in-flight request count (the truth for routing) plus the engine's
reported waiting queue when a fresh engine sample exists; engine signals refine, never replace, it.
"""

from __future__ import annotations

from enum import StrEnum

from router.types import ReplicaView


class LoadUnit(StrEnum):
    """What "load" counts: in-flight requests, or in-flight estimated tokens (prompt + max_tokens)."""

    REQUESTS = "requests"
    TOKENS = "tokens"


def inflight_load(replica: ReplicaView, unit: LoadUnit = LoadUnit.REQUESTS) -> int:
    """The gateway's own in-flight count for `replica` in `unit`."""
    return replica.inflight_tokens if unit is LoadUnit.TOKENS else replica.inflight_requests


def request_load(replica: ReplicaView) -> float:
    """In-flight requests plus the engine's waiting queue when its sample is fresh."""
    waiting = 0.0
    if replica.engine is not None and not replica.engine.stale:
        waiting = replica.engine.waiting
    return replica.inflight_requests + waiting
