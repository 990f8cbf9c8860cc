"""Consistent hashing with bounded loads (CHWBL): the picker behind prefix- and session-affinity.

Plugin types (`router.plugins`): picker `bounded-ring` (this bound, inside the picker) and picker `ring`
(no bound: the first candidate clockwise; pair it with the `load-bound` filter of `router.filters`).

For a request of weight w (1 in the `requests` unit, max(1, prompt + max_tokens estimate) in `tokens`)
over the n eligible candidates:

    bound = ceil(c * (Σ load_i + w) / n)          c = load_factor ≥ 1 (default 1.25)
    a replica admits the request  ⇔  load < bound  and  it is under its concurrency cap (B_max)

The picker walks the ring clockwise from the key's position over the pool's members and takes the first
one that is eligible and admits the request — it never jumps to the global least-loaded replica.
Branches (prefix names / session names):
- `ring_hit` / `session_hit`: the key's owner took it (hops = 0);
- `spillover` / `session_break`: the owner was ineligible (dead, draining, breaker open, excluded) or over
  its bound; hops = members passed before the one that took it;
- `all_over_bound`: no candidate admits it (only possible through B_max, since c ≥ 1 guarantees the
  least-loaded candidate is under the bound) → best load score, the least-load fallback;
- `no_key` / `session_none`: the request has no key → best load score among the candidates under the
  bound (`all_over_bound` when none is).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from router.indexed_picker import IndexedPicker
from router.load import LoadUnit, inflight_load
from router.pickers import best_score_index
from router.prefix_index import PrefixIndex
from router.profile import KeyOwner, Pick
from router.ring import DEFAULT_VIRTUAL_NODES_PER_REPLICA, RingCache, hash_key
from router.types import Branch, ReplicaView, RoutingRequest

DEFAULT_LOAD_FACTOR = 1.25
WITNESS_STRIDE_CHARS = 1024
WITNESS_CAPACITY_PER_REPLICA = 1024

RingKey = Callable[[RoutingRequest], int | None]
"""Maps a request to its 64-bit ring position, or None when it has no key."""


@dataclass(frozen=True, slots=True)
class LoadBound:
    """The CHWBL bound: `ceil(load_factor * (total_load + weight) / n)`, load in `unit`."""

    load_factor: float = DEFAULT_LOAD_FACTOR
    unit: LoadUnit = LoadUnit.REQUESTS

    def __post_init__(self) -> None:
        if self.load_factor < 1.0:
            raise ValueError(f"load_factor must be >= 1.0, got {self.load_factor!r}")

    def request_weight(self, request: RoutingRequest) -> int:
        """1 request, or the request's estimated total tokens (at least 1)."""
        if self.unit is LoadUnit.TOKENS:
            return max(1, request.estimated_total_tokens)
        return 1

    def limit(self, request: RoutingRequest, candidates: Sequence[ReplicaView]) -> int:
        """The bound every candidate's current load is compared against."""
        total_load = sum(inflight_load(replica, self.unit) for replica in candidates)
        return math.ceil(self.load_factor * (total_load + self.request_weight(request)) / len(candidates))

    def admits(self, replica: ReplicaView, limit: int) -> bool:
        """True when `replica` is under `limit` and under its concurrency cap."""
        return inflight_load(replica, self.unit) < limit and replica.has_free_slot


@dataclass(frozen=True, slots=True)
class RingBranches:
    """The labels a ring picker reports: owner took it, moved along the ring, no key."""

    hit: Branch
    moved: Branch
    no_key: Branch


PREFIX_BRANCHES = RingBranches(hit=Branch.RING_HIT, moved=Branch.SPILLOVER, no_key=Branch.NO_KEY)
SESSION_BRANCHES = RingBranches(
    hit=Branch.SESSION_HIT, moved=Branch.SESSION_BREAK, no_key=Branch.SESSION_NONE
)


def prefix_ring_key(request: RoutingRequest) -> int | None:
    """The request's prefix key (the hash of its first K blocks)."""
    return request.prefix_key


def session_ring_key(request: RoutingRequest) -> int | None:
    """xxh3-64 of the session key, or None without one."""
    return None if request.session_key is None else hash_key(request.session_key)


class RingKeySource(StrEnum):
    """What a ring picker hashes (its `key` option): the prefix key or the session key."""

    PREFIX = "prefix"
    SESSION = "session"


RING_KEYS: dict[RingKeySource, tuple[RingKey, RingBranches]] = {
    RingKeySource.PREFIX: (prefix_ring_key, PREFIX_BRANCHES),
    RingKeySource.SESSION: (session_ring_key, SESSION_BRANCHES),
}
"""Each key source with its key function and branch labels."""


class BoundedRingPicker(IndexedPicker):
    """Walks the pool's ring from the request's key to the first candidate under the bound.

    The fallbacks (no key, all over bound) take the best combined score of the profile's scorers (the
    presets: in-flight load in the bound's unit, weight 1; in-flight + engine waiting, weight 0.5), ties
    broken by the seeded RNG. The ring's membership is the pool (every replica of the snapshot,
    eligible or not), cached until the id set changes. With `bound=None` every candidate admits the
    request: plain consistent hashing over the candidates (picker type `ring`).

    The ring routes on the key alone, but it also keeps a prefix index of where each request's blocks
    went — a witness, not an input: it reports the matched blocks of the replica taken and how unevenly
    the pool holds the prefix (`IndexedPicker`); its matched blocks also set the replica's uncached
    prefill tokens in flight (`gateway.upstream.replica_cost`). It records one block hash per
    `WITNESS_STRIDE_CHARS` (1,024 characters ≈ 256 tokens: every 16th block at the default 64-character
    blocks; every block when blocks are that long or longer) in 1,024 entries per replica — ≈ 1M
    characters, prefix-index's default coverage, whatever `index_capacity_blocks` a prefix-index pool
    sets — private to the picker, not shared between instances. The stride is there for the cost: a
    witness of every block makes a long prompt's decision several times dearer. Without a witness the
    learned cap's affinity gate (`cap_max_affinity_share`, when set) reads a prefix- or session-affine
    pool as "no affinity" and caps it (docs/bench-log/2026-12-05-rounds.md, "Fifth round"). A request
    waiting for its key's full owner (`router.prefix_wait.key_owner_wait`) waits whatever the witness
    saw — the owner is every instance's, the witness this instance's — and the witnessed blocks price
    its predicted TTFT there.
    """

    def __init__(
        self,
        key_of: RingKey,
        bound: LoadBound | None,
        branches: RingBranches,
        rng: random.Random,
        virtual_nodes_per_replica: int = DEFAULT_VIRTUAL_NODES_PER_REPLICA,
    ) -> None:
        super().__init__(PrefixIndex(WITNESS_CAPACITY_PER_REPLICA), WITNESS_STRIDE_CHARS)
        self._key_of = key_of
        self._bound = bound
        self._branches = branches
        self._rng = rng
        self._rings = RingCache(virtual_nodes_per_replica)

    def choose(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
        matched: Mapping[str, int],
    ) -> Pick:
        """The first candidate under the bound clockwise from the key, or a fallback."""
        limit = 0 if self._bound is None else self._bound.limit(request, replicas)
        key = self._key_of(request)
        if key is None:
            return self._least_load(replicas, scores, limit)
        position = {replica.replica_id: i for i, replica in enumerate(replicas)}
        hops = 0
        for replica_id in self._rings.ring_for(pool).walk(key):
            index = position.get(replica_id)
            if index is not None and self._admits(replicas[index], limit):
                branch = self._branches.hit if hops == 0 else self._branches.moved
                return Pick(index, branch, {"hops": hops})
            hops += 1
        return Pick(best_score_index(scores, self._rng), Branch.ALL_OVER_BOUND, {"hops": hops})

    def owner(
        self, request: RoutingRequest, candidates: Sequence[ReplicaView], pool: Sequence[ReplicaView]
    ) -> KeyOwner | None:
        """The first of `candidates` clockwise from the request's key, bound and caps aside, with the
        blocks the witness saw go there and whether it is under the bound over `candidates`
        (`router.profile.OwningPicker`); None without a key."""
        key = self._key_of(request)
        if key is None:
            return None
        by_id = {replica.replica_id: replica for replica in candidates}
        for replica_id in self._rings.ring_for(pool).walk(key):
            owner = by_id.get(replica_id)
            if owner is not None:
                stride, hashes = self._strided(request)
                under = self._bound is None or inflight_load(owner, self._bound.unit) < self._bound.limit(
                    request, candidates
                )
                return KeyOwner(replica_id, self._index.matched_blocks(replica_id, hashes) * stride, under)
        return None

    def _least_load(self, replicas: list[ReplicaView], scores: list[float], limit: int) -> Pick:
        """No key: the best load score among the candidates under the bound (all over → least load)."""
        admitted = [i for i, replica in enumerate(replicas) if self._admits(replica, limit)]
        if not admitted:
            return Pick(index=best_score_index(scores, self._rng), branch=Branch.ALL_OVER_BOUND)
        best = best_score_index([scores[i] for i in admitted], self._rng)
        return Pick(index=admitted[best], branch=self._branches.no_key)

    def _admits(self, replica: ReplicaView, limit: int) -> bool:
        return self._bound is None or self._bound.admits(replica, limit)
