"""Hash ring: deterministic placement, clockwise walk, membership-keyed caching."""

from __future__ import annotations

import pytest

from router.ring import HashRing, RingCache, hash_key
from tests.unit.router.snapshots import IDS, fleet, replica


def test_placement_depends_only_on_the_id_set() -> None:
    first = HashRing(["b", "a", "c"])
    second = HashRing(["c", "a", "b", "a"])
    assert first.replica_ids == second.replica_ids == ("a", "b", "c")
    for key in (0, 1, 2**63, 2**64 - 1, hash_key("x")):
        assert list(first.walk(key)) == list(second.walk(key))


def test_walk_yields_every_member_once_starting_at_the_owner() -> None:
    ring = HashRing(IDS)
    for key in (0, 12345, 2**64 - 1):
        order = list(ring.walk(key))
        assert sorted(order) == sorted(IDS)
        assert order[0] == ring.owner(key)


def test_keys_past_the_last_point_wrap_to_the_first() -> None:
    ring = HashRing(IDS, virtual_nodes_per_replica=1)
    assert ring.owner(2**64 - 1) == ring.owner(0)


def test_empty_ring_has_no_owner() -> None:
    ring = HashRing(())
    assert ring.owner(5) is None
    assert len(ring) == 0


def test_virtual_nodes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="virtual_nodes_per_replica"):
        HashRing(IDS, virtual_nodes_per_replica=0)


def test_every_replica_owns_a_fair_share_with_default_virtual_nodes() -> None:
    ring = HashRing(IDS)
    counts = dict.fromkeys(IDS, 0)
    for i in range(4000):
        owner = ring.owner(hash_key(f"key-{i}"))
        assert owner is not None
        counts[owner] += 1
    assert all(700 < count < 1300 for count in counts.values())


def test_cache_rebuilds_only_when_membership_changes() -> None:
    cache = RingCache()
    ring = cache.ring_for(fleet())
    assert cache.builds == 1
    unhealthy = fleet(r1={"healthy": False, "inflight_requests": 9})
    assert cache.ring_for(unhealthy) is ring
    assert cache.ring_for(list(reversed(fleet()))) is ring
    assert cache.builds == 1
    grown = cache.ring_for([*fleet(), replica("r4")])
    assert grown is not ring
    assert grown.replica_ids == (*IDS, "r4")
    assert cache.builds == 2
