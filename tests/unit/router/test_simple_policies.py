"""round-robin, least-load and power-of-two: branches, the healthy filter, seeded tie-breaks."""

from __future__ import annotations

from collections import Counter

import pytest

from router.eligibility import eligible_replicas, is_eligible
from router.types import Branch, EngineLoad, RoutingRequest
from tests.unit.router.snapshots import IDS, decided, fleet, policy, replica

REQUEST = RoutingRequest(model="m")


class TestHealthyFilter:
    @pytest.mark.parametrize("state", [{"healthy": False}, {"draining": True}, {"breaker_open": True}])
    def test_unhealthy_draining_or_open_is_ineligible(self, state: dict[str, object]) -> None:
        assert not is_eligible(replica("r0", **state), REQUEST)

    def test_excluded_is_ineligible_and_order_is_kept(self) -> None:
        request = RoutingRequest(model="m", exclude=frozenset({"r1"}))
        assert [r.replica_id for r in eligible_replicas(request, fleet())] == ["r0", "r2", "r3"]

    @pytest.mark.parametrize("name", ["round-robin", "least-load", "power-of-two"])
    def test_no_eligible_replica_is_none(self, name: str) -> None:
        down = {rid: {"draining": True} for rid in IDS}
        assert policy(name).decide(REQUEST, fleet(**down)) is None


class TestRoundRobin:
    def test_cycles_in_id_order_skipping_ineligible(self) -> None:
        rr = policy("round-robin")
        snapshot = list(reversed(fleet(r1={"healthy": False})))
        picks = [decided(rr.decide(REQUEST, snapshot)) for _ in range(6)]
        assert [d.replica_id for d in picks] == ["r0", "r2", "r3", "r0", "r2", "r3"]
        assert {d.branch for d in picks} == {Branch.ROUND_ROBIN}

    def test_membership_change_does_not_stall_the_cycle(self) -> None:
        rr = policy("round-robin")
        first = decided(rr.decide(REQUEST, fleet(("a", "b")))).replica_id
        second = decided(rr.decide(REQUEST, fleet(("a", "b", "c")))).replica_id
        assert (first, second) == ("a", "b")


class TestLeastLoad:
    def test_picks_the_fewest_in_flight(self) -> None:
        loads = {rid: {"inflight_requests": 3} for rid in IDS}
        loads["r2"] = {"inflight_requests": 1}
        decision = decided(policy("least-load").decide(REQUEST, fleet(**loads)))
        assert (decision.replica_id, decision.branch) == ("r2", Branch.LEAST_LOAD)

    def test_fresh_engine_queue_breaks_an_in_flight_tie_and_stale_is_ignored(self) -> None:
        busy = {"engine": EngineLoad(waiting=5)}
        stale = {"engine": EngineLoad(waiting=0, stale=True)}
        decision = decided(policy("least-load").decide(REQUEST, fleet(("a", "b"), a=busy, b=stale)))
        assert decision.replica_id == "b"

    def test_tie_break_is_reproducible_under_a_seed_and_unbiased_across_seeds(self) -> None:
        def sequence(seed: int) -> list[str]:
            least = policy("least-load", seed=seed)
            return [decided(least.decide(REQUEST, fleet())).replica_id for _ in range(20)]

        assert sequence(7) == sequence(7)
        assert Counter(rid for seed in range(10) for rid in sequence(seed)).keys() == set(IDS)

    def test_single_candidate_branch(self) -> None:
        decision = decided(policy("least-load").decide(REQUEST, fleet(("solo",))))
        assert (decision.replica_id, decision.branch) == ("solo", Branch.SINGLE_CANDIDATE)


class TestPowerOfTwo:
    def test_of_two_replicas_always_takes_the_less_loaded(self) -> None:
        p2c = policy("power-of-two")
        snapshot = fleet(("a", "b"), a={"inflight_requests": 4}, b={"inflight_requests": 1})
        decisions = [decided(p2c.decide(REQUEST, snapshot)) for _ in range(10)]
        assert {(d.replica_id, d.branch) for d in decisions} == {("b", Branch.POWER_OF_TWO)}

    def test_engine_waiting_counts_when_fresh_only(self) -> None:
        p2c = policy("power-of-two")
        waiting = fleet(("a", "b"), a={"engine": EngineLoad(waiting=3)}, b={"inflight_requests": 2})
        stale = fleet(("a", "b"), a={"engine": EngineLoad(waiting=3, stale=True)}, b={"inflight_requests": 2})
        assert decided(p2c.decide(REQUEST, waiting)).replica_id == "b"
        assert decided(p2c.decide(REQUEST, stale)).replica_id == "a"

    def test_never_picks_the_most_loaded_of_many(self) -> None:
        p2c = policy("power-of-two", seed=3)
        loads = {rid: {"inflight_requests": i} for i, rid in enumerate(IDS)}
        picks = Counter(decided(p2c.decide(REQUEST, fleet(**loads))).replica_id for _ in range(2000))
        assert picks["r3"] == 0
        assert picks["r0"] > picks["r1"] > picks["r2"] > 0

    def test_seeded_sequence_is_reproducible(self) -> None:
        def sequence(seed: int) -> list[str]:
            p2c = policy("power-of-two", seed=seed)
            return [decided(p2c.decide(REQUEST, fleet())).replica_id for _ in range(20)]

        assert sequence(11) == sequence(11)

    def test_single_candidate_branch(self) -> None:
        decision = decided(policy("power-of-two").decide(REQUEST, fleet(("solo",))))
        assert decision.branch is Branch.SINGLE_CANDIDATE
