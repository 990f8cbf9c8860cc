"""Prefix-index routing: remember which block hashes were sent where, prefer the longest match.

The index is approximate (it records what the gateway sent, not what the engine kept) and bounded:
per replica an LRU of at most `capacity_blocks_per_replica` block hashes (default 16,384 ≈ 1M characters
≈ 260k tokens, the KV budget of the §7 example), for at most `max_replicas` replicas (default 1,024;
replicas that leave the pool are forgotten). A request's blocks are recorded last-to-first, so within a
request the tail blocks are the least recent and are evicted first, as an engine's prefix cache does;
a prefix therefore stays matchable from its first block.

    matched_i = number of leading request blocks present in replica i's LRU
    prefix score_i = matched_i / number of request blocks        (0 when the request has no blocks)

Imbalance guard (as SGLang's cache-aware router), over load = in-flight + fresh engine waiting:
    imbalanced ⇔ max - min > abs_margin_requests  and  max > rel_margin_ratio * min
When imbalanced the picker (`router.indexed_picker.PrefixIndexPicker`) routes by least load (branch
`imbalance`); otherwise it takes the best combined score (prefix + load scorers) and reports
`prefix_match` (matched > 0) or `prefix_miss`.

Several gateway instances: each instance's index sees only its own decisions. `record` also hands each
record (replica id, block hashes: hashes only, never text) to an optional listener, and `merge` applies
a record learned from another instance without handing it on, so `gateway.fleet.prefix_sharing` can exchange
records through Redis while this module stays pure and synchronous. A policy that routes on an index
exposes it through `IndexedPolicy` (`policy_prefix_index`); the others have nothing to share (the ring
pickers' witness index, `router.bounded`, is private: it reports, it does not route).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.types import ReplicaView, RoutingRequest

DEFAULT_CAPACITY_BLOCKS_PER_REPLICA = 16_384
DEFAULT_MAX_REPLICAS = 1_024
DEFAULT_IMBALANCE_ABS_REQUESTS = 16.0
DEFAULT_IMBALANCE_REL_RATIO = 1.5

RecordListener = Callable[[str, Sequence[int]], None]
"""Called with (replica id, block hashes) after each local `record`; it must not block (no I/O)."""


class PrefixIndex:
    """Per-replica LRU sets of block hashes; never holds more than its bounds."""

    def __init__(
        self,
        capacity_blocks_per_replica: int = DEFAULT_CAPACITY_BLOCKS_PER_REPLICA,
        max_replicas: int = DEFAULT_MAX_REPLICAS,
    ) -> None:
        if capacity_blocks_per_replica < 1 or max_replicas < 1:
            raise ValueError("capacity_blocks_per_replica and max_replicas must be >= 1")
        self.capacity_blocks_per_replica = capacity_blocks_per_replica
        self.max_replicas = max_replicas
        self._lrus: OrderedDict[str, OrderedDict[int, None]] = OrderedDict()
        self._listener: RecordListener | None = None
        self._version = 0
        """Bumped by every change of what the LRUs hold (`merge`, `retain`): the memo's validity."""
        self._memo_hashes: tuple[int, ...] | None = None
        self._memo_version = -1
        self._memo: dict[str, int] = {}

    def listen(self, listener: RecordListener | None) -> None:
        """Hand every later local `record` to `listener` too (None: stop); one listener at a time."""
        self._listener = listener

    def record(self, replica_id: str, prefix_hashes: Sequence[int]) -> None:
        """Note that `prefix_hashes` were sent to `replica_id`, evicting the least recent beyond bounds;
        then hand the record to the listener, if any."""
        if not prefix_hashes:
            return
        self.merge(replica_id, prefix_hashes)
        if self._listener is not None:
            self._listener(replica_id, prefix_hashes)

    def merge(self, replica_id: str, prefix_hashes: Sequence[int]) -> None:
        """Apply a record made elsewhere (another gateway instance) as `record` does, without handing it
        to the listener; the same bounds hold."""
        if not prefix_hashes:
            return
        self._version += 1
        lru = self._lrus.pop(replica_id, None)
        if lru is None:
            lru = OrderedDict()
        self._lrus[replica_id] = lru
        while len(self._lrus) > self.max_replicas:
            self._lrus.popitem(last=False)
        for block_hash in reversed(prefix_hashes[: self.capacity_blocks_per_replica]):
            lru[block_hash] = None
            lru.move_to_end(block_hash)
        while len(lru) > self.capacity_blocks_per_replica:
            lru.popitem(last=False)

    def matched_blocks(self, replica_id: str, prefix_hashes: Sequence[int]) -> int:
        """How many leading blocks of `prefix_hashes` the replica is believed to hold.

        One decision asks this of the same replicas with the same hashes more than once (the
        prefix-match scorer over the candidates, the picker over the pool, the prefix wait over the
        candidates), each a walk of up to 256 blocks: the answers for the last tuple of hashes asked
        about are kept until the index changes (`merge`, `retain`) or another tuple is asked about."""
        if type(prefix_hashes) is tuple:  # immutable: the same object always holds the same hashes
            if prefix_hashes is not self._memo_hashes or self._memo_version != self._version:
                self._memo_hashes, self._memo_version, self._memo = prefix_hashes, self._version, {}
            else:
                known = self._memo.get(replica_id)
                if known is not None:
                    return known
            matched = self._walk(replica_id, prefix_hashes)
            self._memo[replica_id] = matched
            return matched
        return self._walk(replica_id, prefix_hashes)

    def _walk(self, replica_id: str, prefix_hashes: Sequence[int]) -> int:
        lru = self._lrus.get(replica_id)
        if lru is None:
            return 0
        matched = 0
        for block_hash in prefix_hashes:
            if block_hash not in lru:
                break
            matched += 1
        return matched

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget every replica not in `replica_ids` (called when the pool's membership changes)."""
        for replica_id in [r for r in self._lrus if r not in replica_ids]:
            del self._lrus[replica_id]
            self._version += 1

    def blocks(self, replica_id: str) -> int:
        """How many block hashes are held for `replica_id`."""
        lru = self._lrus.get(replica_id)
        return 0 if lru is None else len(lru)

    def replica_ids(self) -> tuple[str, ...]:
        """Replicas with entries, least recently recorded first."""
        return tuple(self._lrus)


class IndexedPolicy(Protocol):
    """A policy that routes on a prefix index (None when its profile has no picker that routes on one;
    the ring pickers' private witness index is not exposed)."""

    @property
    def prefix_index(self) -> PrefixIndex | None: ...


def policy_prefix_index(policy: object) -> PrefixIndex | None:
    """The prefix index `policy` keeps (its `IndexedPolicy.prefix_index`), or None when it keeps none or
    has no such attribute. Read with `getattr`, not an `isinstance` check against a runtime-checkable
    protocol: that check walks the protocol's members on every call, and the serve path asks once per
    request (`gateway.proxy.admit.PoolAdmission.prefer_wait`)."""
    index: PrefixIndex | None = getattr(policy, "prefix_index", None)
    return index


class PrefixMatchScorer:
    """Scores matched leading blocks / request blocks, in [0, 1]."""

    name = "prefix_match"

    def __init__(self, index: PrefixIndex) -> None:
        self._index = index

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[float]:
        total_blocks = len(request.prefix_hashes)
        if total_blocks == 0:
            return [0.0] * len(replicas)
        return [
            self._index.matched_blocks(r.replica_id, request.prefix_hashes) / total_blocks for r in replicas
        ]


@dataclass(frozen=True, slots=True)
class ImbalanceGuard:
    """`max - min > abs_margin_requests and max > rel_margin_ratio * min` over candidate loads."""

    abs_margin_requests: float = DEFAULT_IMBALANCE_ABS_REQUESTS
    rel_margin_ratio: float = DEFAULT_IMBALANCE_REL_RATIO

    def imbalanced(self, loads: Sequence[float]) -> bool:
        """True when load, not cache affinity, must decide."""
        high, low = max(loads), min(loads)
        return high - low > self.abs_margin_requests and high > self.rel_margin_ratio * low
