"""prefix-index: the bounded LRU index, the match scorer, the imbalance guard and every branch."""

from __future__ import annotations

import pytest

from router.keys import KeySettings, build_routing_request
from router.prefix_index import ImbalanceGuard, PrefixIndex, PrefixMatchScorer
from router.types import Branch, EngineLoad, RoutingRequest
from tests.unit.router.snapshots import IDS, decided, fleet, policy, replica

SMALL = KeySettings(block_size_chars=8, max_prefix_chars=512, prefix_key_blocks=2)
SYSTEM = "<|system|>\nYou are a careful assistant who answers in French.\n"


def chat(user: str) -> RoutingRequest:
    return build_routing_request("m", f"{SYSTEM}<|user|>\n{user}\n", SMALL)


class TestIndex:
    def test_record_then_match_the_leading_blocks(self) -> None:
        index = PrefixIndex(capacity_blocks_per_replica=10)
        index.record("r0", (1, 2, 3))
        assert index.matched_blocks("r0", (1, 2, 3, 4)) == 3
        assert index.matched_blocks("r0", (1, 9, 3)) == 1
        assert index.matched_blocks("r1", (1, 2, 3)) == 0

    def test_capacity_evicts_least_recent_and_tail_blocks_first(self) -> None:
        index = PrefixIndex(capacity_blocks_per_replica=4)
        index.record("r0", (1, 2, 3))
        index.record("r0", (7, 8, 9))
        assert index.blocks("r0") == 4
        assert index.matched_blocks("r0", (7, 8, 9)) == 3
        assert index.matched_blocks("r0", (1, 2, 3)) == 1

    def test_a_request_longer_than_the_capacity_keeps_its_head(self) -> None:
        index = PrefixIndex(capacity_blocks_per_replica=2)
        index.record("r0", (1, 2, 3, 4))
        assert index.matched_blocks("r0", (1, 2, 3, 4)) == 2

    def test_replica_count_is_bounded_least_recently_recorded_first(self) -> None:
        index = PrefixIndex(max_replicas=2)
        for replica_id in ("a", "b", "a", "c"):
            index.record(replica_id, (1,))
        assert index.replica_ids() == ("a", "c")

    def test_retain_forgets_departed_replicas_and_empty_records_are_ignored(self) -> None:
        index = PrefixIndex()
        index.record("a", (1,))
        index.record("b", (1,))
        index.record("c", ())
        index.retain({"b"})
        assert index.replica_ids() == ("b",)

    def test_a_repeated_question_sees_every_change_of_the_index(self) -> None:
        """`matched_blocks` keeps the answers for the last tuple asked about: a record, a merge or a
        retain in between, another tuple, or a list (mutable) are never answered from it."""
        index = PrefixIndex(capacity_blocks_per_replica=3)
        hashes = (1, 2, 3)
        assert index.matched_blocks("r0", hashes) == 0
        index.record("r0", (1, 2))
        assert index.matched_blocks("r0", hashes) == 2
        index.merge("r0", (1, 2, 3))
        assert index.matched_blocks("r0", hashes) == 3
        assert index.matched_blocks("r0", hashes) == 3 and index.matched_blocks("r1", hashes) == 0
        index.merge("r0", (7, 8, 9))  # evicts 1, 2, 3
        assert index.matched_blocks("r0", hashes) == 0
        index.merge("r0", (1, 2, 3))
        assert index.matched_blocks("r0", hashes) == 3
        index.retain(frozenset({"r1"}))
        assert index.matched_blocks("r0", hashes) == 0
        index.merge("r1", (1,))
        assert index.matched_blocks("r1", (1, 2, 3)) == 1 and index.matched_blocks("r1", hashes) == 1
        mutable = [1, 5]
        assert index.matched_blocks("r1", mutable) == 1
        mutable[0] = 5
        assert index.matched_blocks("r1", mutable) == 0

    def test_bounds_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="capacity_blocks_per_replica"):
            PrefixIndex(capacity_blocks_per_replica=0)

    def test_scorer_is_the_matched_ratio(self) -> None:
        index = PrefixIndex()
        index.record("r0", (1, 2))
        scorer = PrefixMatchScorer(index)
        request = RoutingRequest(model="m", prefix_hashes=(1, 2, 3, 4))
        assert scorer(request, fleet(("r0", "r1"))) == [0.5, 0.0]
        assert scorer(RoutingRequest(model="m"), fleet(("r0",))) == [0.0]


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ([0, 16], False),  # absolute gap not above 16
        ([0, 17], True),
        ([80, 100], False),  # gap 20 > 16 but 100 <= 1.5 * 80
        ([60, 100], True),
        ([5], False),
    ],
)
def test_imbalance_guard(loads: list[float], expected: bool) -> None:
    assert ImbalanceGuard().imbalanced(loads) is expected


class TestPolicy:
    def test_first_request_is_a_miss_and_the_repeat_matches_the_same_replica(self) -> None:
        index_policy = policy("prefix-index")
        first = decided(index_policy.decide(chat("Bonjour"), fleet()))
        busier = fleet(**{first.replica_id: {"inflight_requests": 1}})
        second = decided(index_policy.decide(chat("Bonjour"), busier))
        assert (first.branch, first.detail.get("matched_prefix_blocks")) == (Branch.PREFIX_MISS, 0)
        assert (second.branch, second.replica_id) == (Branch.PREFIX_MATCH, first.replica_id)
        assert second.detail.get("matched_prefix_blocks") == len(chat("Bonjour").prefix_hashes)
        assert second.header_value().endswith(f"; prefix_blocks={second.detail.get('matched_prefix_blocks')}")

    @pytest.mark.parametrize("name", ["prefix-index", "sticky-prefix", "predicted-latency"])
    def test_an_uncommitted_decision_records_nothing_until_committed(self, name: str) -> None:
        """`decide(commit=False)` leaves the index as it was (a disaggregated pool drops a prefill
        decision when decode has no room); `commit` records it where it went."""
        index_policy = policy(name)
        request = chat("Bonjour " * 200)
        dropped = decided(index_policy.decide(request, fleet(), commit=False))
        again = decided(index_policy.decide(request, fleet(), commit=False))
        assert (dropped.detail.get("matched_prefix_blocks"), again.detail.get("matched_prefix_blocks")) == (
            0,
            0,
        )
        index_policy.commit(request, again)
        after = decided(index_policy.decide(request, fleet()))
        assert after.replica_id == again.replica_id
        assert (after.detail.get("matched_prefix_blocks") or 0) > 0

    def test_shared_system_prompt_follows_its_replica(self) -> None:
        index_policy = policy("prefix-index")
        first = decided(index_policy.decide(chat("one"), fleet()))
        second = decided(index_policy.decide(chat("two, a different question"), fleet()))
        assert second.replica_id == first.replica_id
        assert second.branch is Branch.PREFIX_MATCH
        assert (
            0
            < (second.detail.get("matched_prefix_blocks") or 0)
            < len(chat("two, a different question").prefix_hashes)
        )

    def test_multi_turn_conversation_follows_the_growing_prompt(self) -> None:
        index_policy = policy("prefix-index")
        turn_one = build_routing_request("m", SYSTEM + "<|user|>\nhi\n" + "x" * 40, SMALL)
        turn_two = build_routing_request(
            "m", SYSTEM + "<|user|>\nhi\n" + "x" * 40 + "<|assistant|>\nsalut\n<|user|>\nmore\n", SMALL
        )
        first = decided(index_policy.decide(turn_one, fleet()))
        second = decided(index_policy.decide(turn_two, fleet()))
        assert (second.replica_id, second.branch) == (first.replica_id, Branch.PREFIX_MATCH)
        # every full block of turn one matches; its partial last block is not a prefix of turn two
        assert (
            second.detail.get("matched_prefix_blocks") == len(turn_one.prompt_text) // SMALL.block_size_chars
        )

    def test_imbalance_routes_by_load_even_against_a_match(self) -> None:
        index_policy = policy("prefix-index")
        first = decided(index_policy.decide(chat("Bonjour"), fleet()))
        loads = {rid: {"inflight_requests": 20} for rid in IDS}
        loads[first.replica_id] = {"inflight_requests": 40}
        loads["r3" if first.replica_id != "r3" else "r2"] = {"inflight_requests": 2}
        guarded = decided(index_policy.decide(chat("Bonjour"), fleet(**loads)))
        assert guarded.branch is Branch.IMBALANCE
        assert guarded.replica_id == ("r3" if first.replica_id != "r3" else "r2")
        assert guarded.detail.get("matched_prefix_blocks") == 0

    def test_engine_waiting_counts_towards_imbalance(self) -> None:
        waiting = {"engine": EngineLoad(waiting=30)}
        snapshot = fleet(r0=waiting, r1=waiting, r2=waiting)
        decision = decided(policy("prefix-index").decide(chat("x"), snapshot))
        assert (decision.replica_id, decision.branch) == ("r3", Branch.IMBALANCE)

    def test_margins_are_configurable(self) -> None:
        index_policy = policy("prefix-index", imbalance_abs_requests=100)
        loads = {"r0": {"inflight_requests": 40}}
        decision = decided(index_policy.decide(chat("x"), fleet(**loads)))
        assert decision.branch is Branch.PREFIX_MISS

    def test_the_longest_and_shortest_match_over_the_whole_pool(self) -> None:
        """What the choice of replica wins or loses, whatever the choice: a prefix held only by a
        replica that is not a candidate (dead here; at its cap in the gateway) is a miss where it
        goes, yet held by some replicas (shared) and not by all (common 0)."""
        index_policy = policy("prefix-index")
        first = decided(index_policy.decide(chat("Bonjour"), fleet()))
        assert (first.detail.get("shared_prefix_blocks"), first.detail.get("common_prefix_blocks")) == (0, 0)
        spilled = decided(
            index_policy.decide(chat("Bonjour"), fleet(**{first.replica_id: {"healthy": False}}))
        )
        blocks = len(chat("Bonjour").prefix_hashes)
        assert spilled.detail.get("matched_prefix_blocks") == 0
        assert (spilled.detail.get("shared_prefix_blocks"), spilled.detail.get("common_prefix_blocks")) == (
            blocks,
            0,
        )
        two = ("r0", "r1")
        index_policy = policy("prefix-index")
        index_policy.decide(chat("Bonjour"), fleet(two, r1={"healthy": False}))  # r0 holds it
        index_policy.decide(chat("Bonjour"), fleet(two, r0={"healthy": False}))  # and r1
        both = decided(index_policy.decide(chat("Bonjour"), fleet(two)))
        assert (both.detail.get("shared_prefix_blocks"), both.detail.get("common_prefix_blocks")) == (
            blocks,
            blocks,
        )

    def test_a_match_on_a_dead_replica_is_ignored(self) -> None:
        index_policy = policy("prefix-index")
        first = decided(index_policy.decide(chat("Bonjour"), fleet()))
        again = decided(index_policy.decide(chat("Bonjour"), fleet(**{first.replica_id: {"healthy": False}})))
        assert again.replica_id != first.replica_id
        assert again.branch is Branch.PREFIX_MISS

    def test_a_replica_that_leaves_the_pool_is_forgotten(self) -> None:
        index_policy = policy("prefix-index")
        first = decided(index_policy.decide(chat("Bonjour"), fleet()))
        others = tuple(rid for rid in IDS if rid != first.replica_id)
        decided(index_policy.decide(chat("unrelated"), fleet(others)))
        back = decided(index_policy.decide(chat("Bonjour"), [replica(first.replica_id)]))
        assert (back.branch, back.detail.get("matched_prefix_blocks")) == (Branch.PREFIX_MISS, 0)

    def test_request_without_blocks_is_a_miss(self) -> None:
        decision = decided(policy("prefix-index").decide(RoutingRequest(model="m"), fleet()))
        assert (decision.branch, decision.detail.get("matched_prefix_blocks")) == (Branch.PREFIX_MISS, 0)
