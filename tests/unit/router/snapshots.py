"""Builders for replica snapshots, requests and policies shared by the router unit tests."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from router.presets import PolicyContext, build_policy
from router.profile import Policy
from router.ring import HashRing
from router.types import Decision, EngineLoad, ReplicaView, RoutingRequest

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


def random_snapshot(rng: random.Random, max_replicas: int = 6) -> list[ReplicaView]:
    """A seeded snapshot mixing ineligible replicas, caps, loads and fresh or stale engine samples."""
    return [
        replica(
            f"r{i}",
            healthy=rng.random() > 0.1,
            draining=rng.random() < 0.05,
            breaker_open=rng.random() < 0.05,
            inflight_requests=rng.randint(0, 30),
            inflight_tokens=rng.randint(0, 50_000),
            max_concurrency=rng.choice([None, 10, 25, 40]),
            engine=rng.choice(
                [
                    None,
                    EngineLoad(
                        waiting=rng.uniform(0, 20), kv_usage_ratio=rng.random(), stale=rng.random() < 0.2
                    ),
                ]
            ),
        )
        for i in range(rng.randint(0, max_replicas))
    ]


def random_request(rng: random.Random, replica_ids: Sequence[str]) -> RoutingRequest:
    """A seeded request: recurring or fresh prefix blocks, sessions, sizes and retry exclusions."""
    blocks = tuple(rng.choice([1, 2, 3, 4, 5, rng.getrandbits(64)]) for _ in range(rng.randint(0, 8)))
    return RoutingRequest(
        model="m",
        estimated_prompt_tokens=rng.randint(0, 4000),
        max_tokens=rng.choice([None, 100]),
        session_key=rng.choice([None, "a", "b", "c", str(rng.random())]),
        exclude=frozenset(rng.sample(list(replica_ids), min(len(replica_ids), rng.randint(0, 2)))),
        prefix_hashes=blocks,
        prefix_key=blocks[min(2, len(blocks)) - 1] if blocks else None,
    )


def decisions(chosen: Policy, seed: int, count: int = 300) -> list[Decision | None]:
    """What `chosen` decides over `count` seeded (request, snapshot) pairs, in order."""
    rng = random.Random(seed)
    made: list[Decision | None] = []
    for _ in range(count):
        snapshot = random_snapshot(rng)
        made.append(chosen.decide(random_request(rng, [r.replica_id for r in snapshot]), snapshot))
    return made
