"""Block accounting and the prefix cache's LRU, on the pool alone."""

from __future__ import annotations

import pytest

from mock_engine.physics import KvBlockPool


def test_pinning_sharing_and_release_to_lru() -> None:
    pool = KvBlockPool(10)
    pool.allocate(3)
    pool.register([1, 2, 3])  # the private blocks become cached, still pinned
    assert (pool.used_blocks, pool.cached_blocks, pool.evictable_blocks) == (3, 3, 0)
    assert pool.match_prefix([1, 2, 3, 4]) == (3, 0)
    pool.pin([1, 2])  # a second sequence shares two blocks: held once
    assert pool.used_blocks == 3
    pool.release(0, [1, 2, 3])
    assert (pool.used_blocks, pool.evictable_blocks) == (2, 1)
    pool.release(0, [1, 2])
    assert (pool.used_blocks, pool.free_blocks, pool.evictable_blocks) == (0, 10, 3)
    assert pool.match_prefix([1, 2, 3]) == (3, 3)
    assert pool.match_prefix([2, 3]) == (2, 2)
    assert pool.match_prefix([9, 1]) == (0, 0)


def test_allocation_evicts_lru_so_the_cache_stays_inside_free_kv() -> None:
    pool = KvBlockPool(4)
    pool.allocate(4)
    pool.register([1, 2, 3, 4])
    pool.release(0, [1, 2, 3, 4])  # freed tail first: LRU order 4, 3, 2, 1
    pool.allocate(2)
    assert pool.evictable_blocks == 2
    assert pool.match_prefix([1, 2, 3]) == (2, 2)  # 4 and 3 went first
    pool.pin([1])
    assert (pool.used_blocks, pool.evictable_blocks) == (3, 1)
    with pytest.raises(RuntimeError, match="overcommit"):
        pool.allocate(2)


def test_registering_an_already_cached_block_shares_it() -> None:
    pool = KvBlockPool(8)
    pool.allocate(2)
    pool.register([7])  # first sequence computed block 7
    pool.register([7])  # second computed the same block concurrently: its duplicate is freed
    assert (pool.used_blocks, pool.cached_blocks) == (1, 1)
    pool.release(0, [7])
    pool.release(0, [7])
    assert (pool.used_blocks, pool.evictable_blocks) == (0, 1)
    pool.allocate(1)
    pool.register([7])  # a cached-but-evictable copy is superseded by the fresh one
    assert (pool.used_blocks, pool.evictable_blocks, pool.usage_ratio()) == (1, 0, 1 / 8)


def test_pool_needs_a_block() -> None:
    with pytest.raises(ValueError):
        KvBlockPool(0)
