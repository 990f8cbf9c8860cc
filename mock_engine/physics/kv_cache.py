"""KV block accounting with a prefix cache, in whole blocks of `block_size_tokens`.

A block is either *used* (held by at least one live sequence) or *free*. Free blocks include the
*evictable* cached blocks: prefix blocks no live sequence references any more, kept under their chained
hash (see `tokens.py`) in LRU order so a later prompt with the same prefix can skip their prefill.

    free_blocks = total_blocks - used_blocks
    evictable_blocks ≤ free_blocks           (the cache lives only in free KV; allocation evicts LRU)
    kv_usage_ratio = used_blocks / total_blocks     (what vLLM reports as kv_cache_usage_perc)

Blocks of running sequences are pinned: a cached block with references is never evicted, and two
sequences sharing a prefix block hold it once. A block is registered in the cache only once its
prefill has been computed; a sequence's generated tokens are never cached (the core never sees the text).
Every operation costs O(blocks touched), never O(cache size).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class KvBlockPool:
    """The block allocator and prefix cache of one engine replica (module docstring)."""

    def __init__(self, total_blocks: int) -> None:
        if total_blocks < 1:
            raise ValueError(f"total_blocks must be >= 1, got {total_blocks}")
        self._total_blocks = total_blocks
        self._used_blocks = 0
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def total_blocks(self) -> int:
        return self._total_blocks

    @property
    def used_blocks(self) -> int:
        return self._used_blocks

    @property
    def free_blocks(self) -> int:
        """total - used: what can be allocated (evictable cached blocks included)."""
        return self._total_blocks - self._used_blocks

    @property
    def cached_blocks(self) -> int:
        """Blocks addressable by hash: pinned by a live sequence or evictable."""
        return len(self._refs) + len(self._evictable)

    @property
    def evictable_blocks(self) -> int:
        return len(self._evictable)

    def usage_ratio(self) -> float:
        """used / total."""
        return self._used_blocks / self._total_blocks

    def match_prefix(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(leading blocks of `hashes` found in the cache, how many of those are evictable).

        Pinning the evictable ones takes them out of free KV, so both numbers count against it.
        """
        hit_blocks = 0
        evictable_hits = 0
        for block_hash in hashes:
            if block_hash in self._refs:
                hit_blocks += 1
            elif block_hash in self._evictable:
                hit_blocks += 1
                evictable_hits += 1
            else:
                break
        return hit_blocks, evictable_hits

    def pin(self, hashes: Sequence[int]) -> None:
        """Take a reference on cached blocks (all must be cached: call after `match_prefix`)."""
        for block_hash in hashes:
            if block_hash in self._refs:
                self._refs[block_hash] += 1
            else:
                del self._evictable[block_hash]
                self._refs[block_hash] = 1
                self._used_blocks += 1

    def allocate(self, n_blocks: int) -> None:
        """Take `n_blocks` private (unhashed) blocks, evicting LRU cached blocks to make room."""
        if n_blocks > self.free_blocks:
            raise RuntimeError(f"KV overcommit: {n_blocks} blocks asked, {self.free_blocks} free")
        self._used_blocks += n_blocks
        while len(self._evictable) > self.free_blocks:
            self._evictable.popitem(last=False)

    def register(self, hashes: Sequence[int]) -> None:
        """Turn one private block per hash into a cached, pinned block under that hash.

        When the hash is already cached (another sequence computed the same prefix meanwhile), the
        private duplicate is freed and the existing block is shared instead.
        """
        for block_hash in hashes:
            if block_hash in self._refs:
                self._refs[block_hash] += 1
                self._used_blocks -= 1
            else:
                self._evictable.pop(block_hash, None)
                self._refs[block_hash] = 1

    def release(self, private_blocks: int, hashes: Sequence[int]) -> None:
        """Drop a sequence's blocks: private ones become free, cached ones lose a reference.

        Unreferenced cached blocks join the LRU tail in reverse order, so a prompt's last blocks are
        evicted before its first ones (as vLLM's free queue does).
        """
        self._used_blocks -= private_blocks
        for block_hash in reversed(hashes):
            remaining = self._refs[block_hash] - 1
            if remaining:
                self._refs[block_hash] = remaining
            else:
                del self._refs[block_hash]
                self._evictable[block_hash] = None
                self._used_blocks -= 1
