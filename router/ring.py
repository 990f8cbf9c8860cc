"""An immutable consistent-hash ring of replica ids with virtual nodes.

    point(id, v) = xxh3_64("{id}#{v}")             for v in 0 .. virtual_nodes_per_replica - 1
    owner(key)   = id of the first point ≥ key, wrapping past 2^64 - 1 to the smallest point

The ring depends only on the set of replica ids (not their order, health or load), so every gateway
instance places every key identically without sharing state. Adding or removing one of n replicas moves
≈ 1/n of the keys. Lookups are a bisect over the sorted point array; `RingCache` rebuilds the ring only
when the membership changes. Default 160 virtual nodes per replica (ketama's figure) keeps each
replica's share of the ring within ≈ ±10 % of 1/n.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

import xxhash

from router.types import ReplicaView

DEFAULT_VIRTUAL_NODES_PER_REPLICA = 160


def hash_key(text: str) -> int:
    """A 64-bit ring position for a string key (e.g. a session key)."""
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


class HashRing:
    """Immutable ring; build a new one when membership changes (see `RingCache`)."""

    __slots__ = ("_ids", "_owners", "_points")

    def __init__(
        self, replica_ids: Iterable[str], virtual_nodes_per_replica: int = DEFAULT_VIRTUAL_NODES_PER_REPLICA
    ) -> None:
        if virtual_nodes_per_replica < 1:
            raise ValueError(f"virtual_nodes_per_replica must be >= 1, got {virtual_nodes_per_replica}")
        self._ids: tuple[str, ...] = tuple(sorted(set(replica_ids)))
        points = sorted(
            (hash_key(f"{replica_id}#{v}"), owner)
            for owner, replica_id in enumerate(self._ids)
            for v in range(virtual_nodes_per_replica)
        )
        self._points: list[int] = [point for point, _ in points]
        self._owners: list[int] = [owner for _, owner in points]

    @property
    def replica_ids(self) -> tuple[str, ...]:
        """The members, sorted."""
        return self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def owner(self, key: int) -> str | None:
        """The replica owning `key` (None for an empty ring)."""
        return next(self.walk(key), None)

    def walk(self, key: int) -> Iterator[str]:
        """Every member once, in clockwise order starting from `key`'s owner."""
        total_points = len(self._points)
        start = bisect_left(self._points, key)
        seen: set[int] = set()
        for step in range(total_points):
            owner = self._owners[(start + step) % total_points]
            if owner in seen:
                continue
            seen.add(owner)
            yield self._ids[owner]
            if len(seen) == len(self._ids):
                return


class RingCache:
    """Holds the ring of the pool's current membership; rebuilds it only when the id set changes.

    The cache key is the tuple of replica ids in the order the snapshot lists them (a cheap equality
    check per decision); a reordered but equal set reuses the ring without rebuilding.
    """

    def __init__(self, virtual_nodes_per_replica: int = DEFAULT_VIRTUAL_NODES_PER_REPLICA) -> None:
        self._virtual_nodes = virtual_nodes_per_replica
        self._ids_key: tuple[str, ...] = ()
        self._ring = HashRing((), virtual_nodes_per_replica)
        self.builds = 0
        """How many rings were built (observability and tests)."""

    def ring_for(self, pool: Sequence[ReplicaView]) -> HashRing:
        """The ring of `pool`'s replica ids."""
        ids_key = tuple(replica.replica_id for replica in pool)
        if ids_key != self._ids_key:
            if tuple(sorted(set(ids_key))) != self._ring.replica_ids:
                self._ring = HashRing(ids_key, self._virtual_nodes)
                self.builds += 1
            self._ids_key = ids_key
        return self._ring
