"""Pickers that keep a prefix index: the base every index-keeping picker shares (`IndexedPicker`), the
membership rule that keeps its index to the pool's members (`IndexMembership`), and `prefix-index`'s
own picker (`PrefixIndexPicker`: the imbalance guard, else the best combined score).

The index itself — what it remembers, how it matches, the imbalance guard's rule — is
`router.prefix_index`'s; the other pickers built on `IndexedPicker` are the rings (`router.bounded`) and
the cost-aware pickers (`router.cost_aware`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from router.load import request_load
from router.pickers import best_score_index
from router.prefix_index import ImbalanceGuard, PrefixIndex
from router.profile import Pick
from router.types import Branch, ReplicaView, RoutingRequest


class IndexMembership:
    """Keeps an index to the pool's members: replicas that left are forgotten (one tuple compare per
    decision when nothing changed)."""

    def __init__(self, index: PrefixIndex) -> None:
        self._index = index
        self._pool_ids: tuple[str, ...] = ()

    def follow(self, pool: Sequence[ReplicaView]) -> None:
        """Forget every replica of the index that is not in `pool`, when the membership changed."""
        pool_ids = tuple(replica.replica_id for replica in pool)
        if pool_ids != self._pool_ids:
            self._index.retain(frozenset(pool_ids))
            self._pool_ids = pool_ids


class IndexedPicker:
    """A picker that keeps a prefix index: follows the pool's membership, chooses (`choose`), records
    the request's blocks on the chosen replica once the decision is committed (`record`), and adds to
    the pick's detail (`router.types.RouteDetail`) what the index says of the request —
    `matched_prefix_blocks` on the chosen replica (when `choose` did not), and how unevenly the pool
    holds its prefix (`shared_prefix_blocks` / `common_prefix_blocks`: the longest and the shortest
    match over the whole pool, chosen or not). `choose` returns a pick with a detail of its own (a new
    mapping, shared with nothing), which this completes in place.
    The learned cap's affinity gate reads the last two (`gateway.upstream.replica_cost`); a picker
    that says nothing reads as "no affinity" and is capped, which on a prefix-affine workload spills
    queued requests to replicas without their prefix.

    The index is read once per decision: each pool member's match (`matched`, by replica id; in
    strides when strided) goes to `choose`, which reads its candidates' from it.

    `stride_chars` (default None: every block) records and matches every stride-th block hash only,
    stride = max(1, stride_chars // the request's block size) blocks (blocks stride − 1, 2·stride − 1,
    …): hashes are chained, so each still names the whole prefix up to its block, and a match of m of
    them reports m × stride blocks (short by less than a stride; a prompt shorter than one stride
    reports 0). A picker that only reports, never routes on the index, uses it to pay a stride-th of
    the cost (`router.bounded`)."""

    def __init__(self, index: PrefixIndex, stride_chars: int | None = None) -> None:
        if stride_chars is not None and stride_chars < 1:
            raise ValueError(f"stride_chars must be >= 1, got {stride_chars!r}")
        self._index = index
        self._membership = IndexMembership(index)
        self._stride_chars = stride_chars

    def __call__(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
    ) -> Pick:
        self._membership.follow(pool)
        stride, hashes = self._strided(request)
        matched_by_replica = {r.replica_id: self._index.matched_blocks(r.replica_id, hashes) for r in pool}
        held = matched_by_replica.values() or [0]
        shared, common = max(held), min(held)
        pick = self.choose(request, replicas, scores, pool, matched_by_replica)
        detail = pick.detail
        if "matched_prefix_blocks" not in detail:
            detail["matched_prefix_blocks"] = matched_by_replica[replicas[pick.index].replica_id] * stride
        detail["shared_prefix_blocks"] = shared * stride
        detail["common_prefix_blocks"] = common * stride
        return pick

    def record(self, request: RoutingRequest, replica_id: str) -> None:
        """Record the request's blocks (strided when strided) on `replica_id`: the decision was taken
        (`router.profile.Recorder`; the profile calls this when the decision is committed)."""
        self._index.record(replica_id, self._strided(request)[1])

    def _strided(self, request: RoutingRequest) -> tuple[int, Sequence[int]]:
        """(stride in blocks, the block hashes read and recorded): every block unless strided."""
        stride = 1 if self._stride_chars is None else max(1, self._stride_chars // request.block_size_chars)
        hashes = request.prefix_hashes if stride == 1 else request.prefix_hashes[stride - 1 :: stride]
        return stride, hashes

    def choose(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
        matched: Mapping[str, int],
    ) -> Pick:
        """The choice, without recording it; `matched` holds every pool member's match (class
        docstring), read before this request."""
        raise NotImplementedError


class PrefixIndexPicker(IndexedPicker):
    """Imbalance guard, else the best combined score; records the request's blocks where it goes."""

    def __init__(self, index: PrefixIndex, guard: ImbalanceGuard, rng: random.Random) -> None:
        super().__init__(index)
        self._guard = guard
        self._rng = rng

    def choose(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
        matched: Mapping[str, int],
    ) -> Pick:
        """The imbalance guard's least load, else the best combined score."""
        loads = [request_load(replica) for replica in replicas]
        if self._guard.imbalanced(loads):
            index = best_score_index([-load for load in loads], self._rng)
            return Pick(index=index, branch=Branch.IMBALANCE)
        index = best_score_index(scores, self._rng)
        branch = Branch.PREFIX_MATCH if matched[replicas[index].replica_id] > 0 else Branch.PREFIX_MISS
        return Pick(index=index, branch=branch)
