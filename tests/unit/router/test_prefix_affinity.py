"""prefix-affinity (CHWBL): every branch, the bound, the walk, and placement across instances."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from router.bounded import LoadBound
from router.indexed_picker import IndexedPicker
from router.keys import KeySettings, build_routing_request
from router.load import LoadUnit
from router.prefix_index import PrefixIndex
from router.types import Branch, Decision
from tests.unit.router.snapshots import IDS, decided, fleet, policy, prefix_request, ring_order

KEY = prefix_request().prefix_key
assert KEY is not None
ORDER = ring_order(KEY)


def decide(**per_replica: Mapping[str, object]) -> Decision:
    return decided(policy("prefix-affinity").decide(prefix_request(), fleet(**per_replica)))


def test_idle_fleet_sends_the_key_to_its_owner() -> None:
    decision = decide()
    assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
        ORDER[0],
        Branch.RING_HIT,
        0,
    )
    assert decision.header_value() == "policy=prefix-affinity; branch=ring_hit; hops=0; prefix_blocks=0"


def test_owner_over_bound_spills_to_the_next_replica_clockwise() -> None:
    # total 10, n 4: bound = ceil(1.25 * 11 / 4) = 4 -> owner (10) is over, next (0) is under
    decision = decide(**{ORDER[0]: {"inflight_requests": 10}})
    assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
        ORDER[1],
        Branch.SPILLOVER,
        1,
    )


def test_spillover_walks_the_ring_instead_of_jumping_to_the_least_loaded() -> None:
    # total 12: bound = ceil(1.25 * 13 / 4) = 5; the next replica (2) is under it although others hold 0
    decision = decide(**{ORDER[0]: {"inflight_requests": 10}, ORDER[1]: {"inflight_requests": 2}})
    assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
        ORDER[1],
        Branch.SPILLOVER,
        1,
    )


def test_hops_count_every_replica_passed() -> None:
    # total 20: bound = ceil(1.25 * 21 / 4) = 7 -> both first replicas are over
    decision = decide(**{ORDER[0]: {"inflight_requests": 10}, ORDER[1]: {"inflight_requests": 10}})
    assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
        ORDER[2],
        Branch.SPILLOVER,
        2,
    )


def test_ineligible_owner_moves_the_key_to_the_next_replica() -> None:
    for state in ({"healthy": False}, {"draining": True}, {"breaker_open": True}):
        decision = decide(**{ORDER[0]: state})
        assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
            ORDER[1],
            Branch.SPILLOVER,
            1,
        )


def test_retry_excludes_the_failed_owner() -> None:
    request = prefix_request(exclude=frozenset({ORDER[0]}))
    decision = policy("prefix-affinity").decide(request, fleet())
    assert decision is not None
    assert (decision.replica_id, decision.branch) == (ORDER[1], Branch.SPILLOVER)


def test_owner_at_its_concurrency_cap_counts_as_over_bound() -> None:
    decision = decide(**{ORDER[0]: {"inflight_requests": 1, "max_concurrency": 1}})
    assert (decision.replica_id, decision.branch) == (ORDER[1], Branch.SPILLOVER)


def test_every_replica_at_its_cap_gives_no_decision_so_the_request_waits() -> None:
    full = {rid: {"inflight_requests": 3, "max_concurrency": 3} for rid in IDS}
    full[ORDER[2]] = {"inflight_requests": 1, "max_concurrency": 1}
    assert policy("prefix-affinity").decide(prefix_request(), fleet(**full)) is None


def test_no_key_goes_to_the_least_loaded_replica_under_the_bound() -> None:
    loads = {rid: {"inflight_requests": 5} for rid in IDS}
    loads["r2"] = {"inflight_requests": 1}
    decision = policy("prefix-affinity").decide(prefix_request(key=None), fleet(**loads))
    assert decision is not None
    assert (decision.replica_id, decision.branch) == ("r2", Branch.NO_KEY)


def test_no_key_skips_a_replica_at_its_cap_even_when_least_loaded() -> None:
    loads = {rid: {"inflight_requests": 2} for rid in IDS}
    loads["r2"] = {"inflight_requests": 1, "max_concurrency": 1}
    decision = policy("prefix-affinity").decide(prefix_request(key=None), fleet(**loads))
    assert decision is not None
    assert decision.replica_id != "r2"
    assert decision.branch is Branch.NO_KEY


def test_no_key_with_every_replica_full_gives_no_decision() -> None:
    full = {rid: {"inflight_requests": 1, "max_concurrency": 1} for rid in IDS}
    assert policy("prefix-affinity").decide(prefix_request(key=None), fleet(**full)) is None


def test_tokens_unit_bounds_by_inflight_tokens() -> None:
    heavy = {ORDER[0]: {"inflight_tokens": 50_000}}
    request = prefix_request(estimated_prompt_tokens=100, max_tokens=100)
    by_tokens = policy("prefix-affinity", load_unit="tokens").decide(request, fleet(**heavy))
    by_requests = policy("prefix-affinity").decide(request, fleet(**heavy))
    assert by_tokens is not None and by_requests is not None
    assert (by_tokens.replica_id, by_tokens.branch) == (ORDER[1], Branch.SPILLOVER)
    assert (by_requests.replica_id, by_requests.branch) == (ORDER[0], Branch.RING_HIT)


def test_a_larger_load_factor_keeps_affinity_longer() -> None:
    # total 3 on the owner: c = 1.25 -> bound ceil(1.25 * 4 / 4) = 2 (over); c = 3 -> bound 3 (over);
    # c = 4 -> bound 4 (under)
    loads = {ORDER[0]: {"inflight_requests": 3}}
    strict = decided(policy("prefix-affinity").decide(prefix_request(), fleet(**loads)))
    tolerant = decided(policy("prefix-affinity", load_factor=4.0).decide(prefix_request(), fleet(**loads)))
    assert (strict.branch, tolerant.branch) == (Branch.SPILLOVER, Branch.RING_HIT)


def test_single_replica_is_a_ring_hit() -> None:
    decision = policy("prefix-affinity").decide(prefix_request(), fleet(("solo",)))
    assert decision is not None
    assert (decision.replica_id, decision.branch, decision.candidates) == ("solo", Branch.RING_HIT, 1)


def test_no_eligible_replica_returns_none() -> None:
    down = {rid: {"healthy": False} for rid in IDS}
    assert policy("prefix-affinity").decide(prefix_request(), fleet(**down)) is None


def test_two_gateway_instances_place_keys_identically() -> None:
    first, second = policy("prefix-affinity", seed=1), policy("prefix-affinity", seed=2)
    for key in range(0, 2**64, 2**58):
        request = prefix_request(key=key)
        a, b = first.decide(request, fleet()), second.decide(request, list(reversed(fleet())))
        assert a is not None and b is not None
        assert a.replica_id == b.replica_id


def test_bound_formula() -> None:
    bound = LoadBound(load_factor=1.25, unit=LoadUnit.REQUESTS)
    assert bound.limit(prefix_request(), fleet(r0={"inflight_requests": 7})) == 3  # ceil(1.25*8/4)
    tokens = LoadBound(unit=LoadUnit.TOKENS)
    assert tokens.request_weight(prefix_request()) == 1
    assert tokens.request_weight(prefix_request(estimated_prompt_tokens=10, max_tokens=5)) == 15


@pytest.mark.parametrize("name", ["prefix-affinity", "session-affinity"])
def test_the_ring_says_how_unevenly_the_pool_holds_the_prefix(name: str) -> None:
    """The ring routes on its key, but the learned cap's affinity gate needs what a prefix index would
    say: without it a prefix-affine ring read as "no affinity" and was capped (cache hit 45 % vs 70 %,
    goodput 0.69x, shared prefixes at 24 req/s). A prompt no replica holds reads as none."""
    ring = policy(name)
    shared = "s" * 4096
    first = decided(ring.decide(build_routing_request("m", shared + "q1", session_key="t"), fleet()))
    assert (
        first.detail.get("matched_prefix_blocks"),
        first.detail.get("shared_prefix_blocks"),
        first.detail.get("common_prefix_blocks"),
    ) == (0, 0, 0)
    second = decided(ring.decide(build_routing_request("m", shared + "q2", session_key="t"), fleet()))
    assert second.replica_id == first.replica_id
    assert (
        second.detail.get("shared_prefix_blocks") == second.detail.get("matched_prefix_blocks") == 4096 // 64
    )
    assert second.detail.get("common_prefix_blocks") == 0, "only the owner holds it"
    assert f"prefix_blocks={4096 // 64}" in second.header_value()
    unique = decided(ring.decide(build_routing_request("m", "u" * 4096, session_key="t"), fleet()))
    assert (unique.detail.get("shared_prefix_blocks"), unique.detail.get("common_prefix_blocks")) == (0, 0)


def test_a_prefix_every_replica_holds_is_no_affinity() -> None:
    """Spread over the whole pool: once every replica has been sent the prefix (its owner was out in
    turn), the longest and the shortest match are equal, so nothing between them is at stake."""
    ring = policy("prefix-affinity")
    two = ("r0", "r1")
    prompt = "s" * 1024
    ring.decide(build_routing_request("m", prompt + "a"), fleet(two, r1={"healthy": False}))
    ring.decide(build_routing_request("m", prompt + "b"), fleet(two, r0={"healthy": False}))
    both = decided(ring.decide(build_routing_request("m", prompt + "c"), fleet(two)))
    assert both.detail.get("shared_prefix_blocks") == both.detail.get("common_prefix_blocks") == 1024 // 64


def test_the_witness_counts_in_strides_of_sixteen_blocks() -> None:
    """It records every 16th chained hash (each names the prefix up to its block): a match reports
    whole strides, short by less than one, and a prompt under one stride reports nothing."""
    ring = policy("prefix-affinity")
    forty_blocks = "s" * (64 * 40)
    ring.decide(build_routing_request("m", forty_blocks + "a"), fleet())
    again = decided(ring.decide(build_routing_request("m", forty_blocks + "b"), fleet()))
    assert again.detail.get("matched_prefix_blocks") == again.detail.get("shared_prefix_blocks") == 32
    short = "t" * (64 * 15)
    ring.decide(build_routing_request("m", short), fleet())
    repeated = decided(ring.decide(build_routing_request("m", short), fleet()))
    assert (repeated.detail.get("matched_prefix_blocks"), repeated.detail.get("shared_prefix_blocks")) == (
        0,
        0,
    )


def test_the_stride_is_in_characters_whatever_the_block_size() -> None:
    """With 512-character blocks the stride is 2 blocks (1,024 characters): a 2,000-token prefix is
    still seen, as prefix-index would see it."""
    ring = policy("prefix-affinity", block_size_chars=512)
    keys = KeySettings(block_size_chars=512)
    prefix = "s" * 9000  # 17 whole blocks of 512: the ring's key (16 blocks) is in the shared part
    first = decided(ring.decide(build_routing_request("m", prefix + "a", keys), fleet()))
    again = decided(ring.decide(build_routing_request("m", prefix + "b", keys), fleet()))
    assert again.replica_id == first.replica_id
    assert (
        again.detail.get("shared_prefix_blocks") == again.detail.get("matched_prefix_blocks") == 16
    )  # 8 strides of 2 blocks


def test_a_stride_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="stride_chars"):
        IndexedPicker(PrefixIndex(), stride_chars=0)
