"""What the prefix index offers for sharing across gateway instances: local records reach a listener,
records from elsewhere are merged without echo under the same bounds, and a policy says whether it
keeps an index (`IndexedPolicy`)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from router.prefix_index import PrefixIndex, policy_prefix_index
from router.presets import PolicyContext, build_policy
from router.types import RoutingRequest
from tests.unit.router.snapshots import decided, fleet


class Heard:
    def __init__(self) -> None:
        self.records: list[tuple[str, tuple[int, ...]]] = []

    def __call__(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        self.records.append((replica_id, tuple(block_hashes)))


def test_a_local_record_reaches_the_listener_after_it_is_applied() -> None:
    index = PrefixIndex(capacity_blocks_per_replica=8)
    seen_matched: list[int] = []
    index.listen(lambda rid, hashes: seen_matched.append(index.matched_blocks(rid, hashes)))
    index.record("r0", (1, 2, 3))
    assert seen_matched == [3]


def test_merge_applies_like_record_but_is_not_handed_on() -> None:
    index, heard = PrefixIndex(capacity_blocks_per_replica=8), Heard()
    index.listen(heard)
    index.merge("r1", (5, 6))
    index.record("r0", (1, 2))
    assert index.matched_blocks("r1", (5, 6, 7)) == 2
    assert heard.records == [("r0", (1, 2))]


def test_empty_records_are_neither_applied_nor_handed_on() -> None:
    index, heard = PrefixIndex(), Heard()
    index.listen(heard)
    index.record("r0", ())
    index.merge("r0", ())
    assert heard.records == [] and index.replica_ids() == ()


def test_listen_none_stops_handing_on() -> None:
    index, heard = PrefixIndex(), Heard()
    index.listen(heard)
    index.listen(None)
    index.record("r0", (1,))
    assert heard.records == []


def test_merged_records_obey_the_index_bounds() -> None:
    index = PrefixIndex(capacity_blocks_per_replica=3, max_replicas=2)
    index.merge("r0", (1, 2, 3, 4, 5))
    assert index.blocks("r0") == 3 and index.matched_blocks("r0", (1, 2, 3, 4, 5)) == 3
    index.merge("r1", (9,))
    index.merge("r2", (8,))
    assert index.replica_ids() == ("r1", "r2")


@pytest.mark.parametrize("name", ["prefix-index", "sticky-prefix", "predicted-latency"])
def test_policies_that_keep_an_index_expose_the_one_their_picker_records_into(name: str) -> None:
    policy = build_policy(name, PolicyContext(rng=random.Random(1)))
    index = policy_prefix_index(policy)
    assert index is not None
    replicas = fleet(("r0", "r1", "r2"))
    index.merge("r1", (11, 12, 13))  # the policy reads what was merged
    heard = Heard()
    index.listen(heard)
    request = RoutingRequest(model="m", prefix_hashes=(11, 12, 13), prefix_key=13)
    assert decided(policy.decide(request, replicas)).replica_id == "r1"
    assert heard.records == [("r1", (11, 12, 13))]


@pytest.mark.parametrize("name", ["round-robin", "least-load", "power-of-two", "prefix-affinity"])
def test_policies_without_an_index_expose_none(name: str) -> None:
    assert policy_prefix_index(build_policy(name, PolicyContext(rng=random.Random(1)))) is None


def test_a_custom_profile_exposes_its_index_when_its_picker_keeps_one() -> None:
    spec = {"scorers": [{"type": "prefix-match"}], "picker": {"type": "prefix-index"}}
    with_index = build_policy("custom", PolicyContext(rng=random.Random(1), profile=spec))
    plain = {"picker": {"type": "max-score"}}
    without = build_policy("custom", PolicyContext(rng=random.Random(1), profile=plain))
    assert policy_prefix_index(with_index) is not None
    assert policy_prefix_index(without) is None
    assert policy_prefix_index(object()) is None
