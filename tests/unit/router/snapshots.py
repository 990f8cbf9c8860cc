"""Builders for replica snapshots, requests and policies shared by the router unit tests."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from router.presets import PolicyContext, build_policy
from router.profile import Policy
from router.ring import HashRing
from router.types import Decision, ReplicaView, RoutingRequest

IDS = ("r0", "r1", "r2", "r3")


def replica(replica_id: str, **fields: Any) -> ReplicaView:
    """A healthy, idle replica unless `fields` say otherwise."""
    return ReplicaView(replica_id=replica_id, url=f"http://{replica_id}:8000", **fields)


def fleet(ids: tuple[str, ...] = IDS, /, **per_replica: Mapping[str, Any]) -> list[ReplicaView]:
    """One replica per id; `per_replica[id]` overrides that replica's fields."""
    return [replica(rid, **per_replica.get(rid, {})) for rid in ids]


def policy(name: str, /, seed: int = 0, **options: Any) -> Policy:
    return build_policy(name, PolicyContext(rng=random.Random(seed), options=options))


def prefix_request(key: int | None = 0x1234_5678_9ABC_DEF0, **fields: Any) -> RoutingRequest:
    return RoutingRequest(model="m", prefix_key=key, **fields)


def session_request(session: str | None = "session-42", **fields: Any) -> RoutingRequest:
    return RoutingRequest(model="m", session_key=session, **fields)


def ring_order(key: int, ids: tuple[str, ...] = IDS) -> list[str]:
    """The clockwise member order a key sees on the ring of `ids` (default virtual nodes)."""
    return list(HashRing(ids).walk(key))


def decided(decision: Decision | None) -> Decision:
    """The decision, asserting the policy found an eligible replica."""
    assert decision is not None, "expected a decision, got None (no eligible replica)"
    return decision
