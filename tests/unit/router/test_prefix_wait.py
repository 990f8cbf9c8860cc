"""The "wait for the prefix's owner or spill" decision (router/prefix_wait.py), against hand-computed
budgets: W = (ahead + 1) × S_owner / inflight (S_owner: the owner's own mean hold, else the pool's),
slack = min(slo − waited − W − T, deadline − now − W), the first term alone while the owner has room at
the deadline's last try; and the same for a ring's key owner."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from router.latency_model import LatencyEstimate
from router.prefix_index import PrefixIndex
from router.prefix_wait import OwnerWait, QueueState, key_owner_wait, owner_wait
from router.profile import KeyOwner, Profile
from router.types import EngineLoad, RoutingRequest
from tests.unit.router.snapshots import decided, fleet, policy, prefix_request, ring_order

HASHES = tuple(range(100, 110))  # a 10-block prompt
FULL = {"inflight_requests": 4, "max_concurrency": 4}
FREE = {"inflight_requests": 1, "max_concurrency": 4}


def request(**fields: Any) -> RoutingRequest:
    values: dict[str, Any] = {"prefix_hashes": HASHES, "slo_ttft_s": 4.0, "estimated_prompt_tokens": 160}
    values.update(fields)
    return RoutingRequest(model="m", **values)


def queue(**fields: Any) -> QueueState:
    values: dict[str, Any] = {
        "now_s": 100.0,
        "waited_s": 0.0,
        "deadline_s": 102.0,
        "mean_hold_s": 8.0,
        "ahead_by_replica": {},
    }
    values.update(fields)
    return QueueState(**values)


def index_with(**matched: int) -> PrefixIndex:
    """An index where replica `id` holds the first `matched[id]` blocks of HASHES."""
    index = PrefixIndex()
    for replica_id, blocks in matched.items():
        index.record(replica_id, HASHES[:blocks])
    return index


def test_waits_for_the_full_owner_while_another_replica_is_free() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    wait = owner_wait(request(), views, index_with(r0=10), queue())
    # W = 1 × 8 / 4 = 2 s; slack = min(4 − 0 − 2 − 0, 102 − 100 − 2) = 0 → no: the deadline term binds
    assert wait is None
    wait = owner_wait(request(), views, index_with(r0=10), queue(deadline_s=103.0))
    assert wait == OwnerWait("r0", until_s=101.0, expected_wait_s=2.0, predicted_ttft_s=0.0)


def test_an_owner_with_room_at_the_deadlines_last_try_is_waited_for_through_the_deadline() -> None:
    """The deadline's last try (`deadline_headroom`) takes the owner's slot within the headroom: the
    wait is then bounded by the TTFT objective alone, not by the expected slot before the deadline."""
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    asked: list[str] = []

    def room(replica_id: str) -> bool:
        asked.append(replica_id)
        return replica_id == "r0"

    # W = 2 s; slack = 4 − 0 − 2 − 0 = 2 (the deadline term, 102 − 100 − 2 = 0, no longer binds)
    wait = owner_wait(request(), views, index_with(r0=10), queue(room_at_deadline=room))
    assert wait == OwnerWait("r0", until_s=102.0, expected_wait_s=2.0, predicted_ttft_s=0.0)
    assert asked == ["r0"], "asked about the owner only"
    late = queue(room_at_deadline=room, waited_s=2.5)  # 4 − 2.5 − 2 < 0: the objective still bounds it
    assert owner_wait(request(), views, index_with(r0=10), late) is None


def test_an_owner_without_room_at_the_deadline_is_waited_for_only_until_the_expected_slot() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    full = queue(room_at_deadline=lambda replica_id: False)
    assert owner_wait(request(), views, index_with(r0=10), full) is None, "spills in time, as without"
    wait = owner_wait(request(), views, index_with(r0=10), replace(full, deadline_s=103.0))
    assert wait == OwnerWait("r0", until_s=101.0, expected_wait_s=2.0, predicted_ttft_s=0.0)


def test_the_deadlines_last_try_is_not_asked_when_the_deadline_does_not_bind() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)

    def room(replica_id: str) -> bool:
        raise AssertionError("not needed: the TTFT objective ends the wait first")

    wait = owner_wait(request(), views, index_with(r0=10), queue(deadline_s=110.0, room_at_deadline=room))
    assert wait is not None and wait.until_s == pytest.approx(102.0)


def test_a_keys_owner_with_room_at_the_deadline_is_waited_for_through_it() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    wait = key_owner_wait(request(), views, KeyOwner("r0", 10), queue(room_at_deadline=lambda rid: True))
    assert wait == OwnerWait("r0", until_s=102.0, expected_wait_s=2.0, predicted_ttft_s=0.0)


def test_the_ttft_objective_bounds_the_wait_with_the_time_already_waited() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    wait = owner_wait(request(), views, index_with(r0=10), queue(waited_s=1.5, deadline_s=110.0))
    assert wait is not None and wait.until_s == pytest.approx(100.5)  # 4 − 1.5 − 2
    assert owner_wait(request(), views, index_with(r0=10), queue(waited_s=2.0, deadline_s=110.0)) is None


def test_waiters_ahead_for_the_same_owner_lengthen_the_expected_wait() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    ahead = queue(deadline_s=110.0, ahead_by_replica={"r0": 2, "r1": 5})
    wait = owner_wait(request(slo_ttft_s=10.0), views, index_with(r0=10), ahead)
    assert wait is not None and wait.expected_wait_s == pytest.approx(6.0)  # (2 + 1) × 8 / 4
    assert owner_wait(request(), views, index_with(r0=10), ahead) is None  # 6 s > the 4 s objective


def test_behind_other_instances_the_owners_whole_batch_frees_the_requests_slot() -> None:
    """Own 4 of the owner's 12 (other gateway instances run 8 there): its slots free at 12 / 8 per s,
    the waiters ahead everywhere taken as 3 × this instance's. W = (ahead + 4/12) × 8 / 4."""
    decoding = {**FULL, "decoding_requests": 4}
    views = fleet(("r0", "r1"), r0={**decoding, "engine": EngineLoad(running=12.0)}, r1=FREE)
    wait = owner_wait(request(), views, index_with(r0=10), queue())
    assert wait is not None and wait.expected_wait_s == pytest.approx(2 / 3)  # alone it was 2 s: spill
    ahead = queue(deadline_s=110.0, ahead_by_replica={"r0": 1})
    wait = owner_wait(request(), views, index_with(r0=10), ahead)
    assert wait is not None and wait.expected_wait_s == pytest.approx(8 / 3)  # (1 + 1/3) × 8 / 4
    stale = fleet(("r0", "r1"), r0={**decoding, "engine": EngineLoad(running=12.0, stale=True)}, r1=FREE)
    assert owner_wait(request(), stale, index_with(r0=10), queue()) is None, "a stale sample: share 1"


def test_the_owners_predicted_ttft_with_its_prefix_hit_counts_against_the_objective() -> None:
    slow = LatencyEstimate(ttft=(1.5, 0.0, 0.0, 0.0, 0.0, 0.0))  # 1.5 s whatever it finds
    views = fleet(("r0", "r1"), r0={**FULL, "latency": slow}, r1=FREE)
    wait = owner_wait(request(), views, index_with(r0=10), queue(deadline_s=110.0))
    assert wait is not None and wait.predicted_ttft_s == pytest.approx(1.5)
    assert wait.until_s == pytest.approx(100.5)  # 4 − 2 − 1.5
    cold = LatencyEstimate()  # no warm model: no TTFT term
    views = fleet(("r0", "r1"), r0={**FULL, "latency": cold}, r1=FREE)
    cold_wait = owner_wait(request(), views, index_with(r0=10), queue(deadline_s=110.0))
    assert cold_wait is not None and cold_wait.predicted_ttft_s == 0.0


def test_the_owners_predicted_ttft_prices_the_requests_own_uncached_tokens() -> None:
    """Own tokens at a4 = 1 s per 1,000 on top of the tokens ahead: the owner holds 8 of the 10 blocks
    (128 of 160 tokens left 32): T = 0.5 + 0.032."""
    model = LatencyEstimate(ttft=(0.5, 0.0, 0.0, 0.0, 1.0, 0.0))
    views = fleet(("r0", "r1"), r0={**FULL, "latency": model}, r1=FREE)
    wait = owner_wait(request(), views, index_with(r0=8), queue(deadline_s=110.0))
    assert wait is not None and wait.predicted_ttft_s == pytest.approx(0.5 + 0.032)


def test_the_owners_predicted_ttft_reads_the_phase_of_its_step_in_flight() -> None:
    """a5 = −0.1 s per 0.1 s since the owner's last token: 30 ms into its step, T = 0.5 − 0.03."""
    model = LatencyEstimate(ttft=(0.5, 0.0, 0.0, 0.0, 0.0, -0.1))
    views = fleet(("r0", "r1"), r0={**FULL, "latency": model, "since_last_token_s": 0.03}, r1=FREE)
    wait = owner_wait(request(), views, index_with(r0=10), queue(deadline_s=110.0))
    assert wait is not None and wait.predicted_ttft_s == pytest.approx(0.5 - 0.03)


@pytest.mark.parametrize(
    ("why", "req", "views", "state"),
    [
        ("no blocks", {"prefix_hashes": ()}, None, {}),
        ("no TTFT objective", {"slo_ttft_s": None}, None, {}),
        ("no hold time measured yet", {}, None, {"mean_hold_s": None}),
        ("nothing free elsewhere", {}, {"r0": FULL, "r1": FULL}, {}),
        ("the owner has a free slot", {}, {"r0": FREE, "r1": FREE}, {}),
        ("the owner is excluded (a retry)", {"exclude": frozenset({"r0"})}, None, {}),
        ("the owner is down", {}, {"r0": {**FULL, "healthy": False}, "r1": FREE}, {}),
        (
            "the owner does not serve the model",
            {},
            {"r0": {**FULL, "models": frozenset({"x"})}, "r1": FREE},
            {},
        ),
    ],
)
def test_spills_or_waits_anyway_without_a_reason_to_hold(
    why: str, req: dict[str, Any], views: dict[str, Any] | None, state: dict[str, Any]
) -> None:
    per_replica = views or {"r0": FULL, "r1": FREE}
    snapshot = fleet(("r0", "r1"), **per_replica)
    assert (
        owner_wait(request(**req), snapshot, index_with(r0=10), queue(deadline_s=110.0, **state)) is None
    ), why


def test_a_match_under_the_ratio_is_not_worth_waiting_for() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    state = queue(deadline_s=110.0)
    assert owner_wait(request(), views, index_with(r0=4), state) is None  # 4 of 10 < half
    assert owner_wait(request(), views, index_with(r0=5), state) is not None  # exactly half
    assert owner_wait(request(), views, index_with(r0=4), state, min_match_ratio=0.3) is not None


def test_a_free_replica_holding_enough_of_the_prompt_takes_it_instead() -> None:
    views = fleet(("r0", "r1", "r2"), r0=FULL, r1=FREE, r2=FREE)
    state = queue(deadline_s=110.0)
    assert owner_wait(request(), views, index_with(r0=10, r1=6), state) is None
    wait = owner_wait(request(), views, index_with(r0=10, r1=3), state)  # r1's 3 blocks: not worth it
    assert wait is not None and wait.replica_id == "r0"


def test_among_full_owners_the_best_match_then_the_soonest_slot_is_waited_for() -> None:
    views = fleet(("r0", "r1", "r2"), r0=FULL, r1=FULL, r2=FREE)
    state = queue(deadline_s=110.0, ahead_by_replica={"r0": 1})
    best_match = owner_wait(request(slo_ttft_s=10.0), views, index_with(r0=10, r1=8), state)
    assert best_match is not None and best_match.replica_id == "r0"
    tie = owner_wait(request(slo_ttft_s=10.0), views, index_with(r0=10, r1=10), state)
    assert tie is not None and tie.replica_id == "r1" and tie.expected_wait_s == pytest.approx(2.0)


def test_the_owners_own_mean_hold_time_sets_its_expected_wait() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    state = queue(deadline_s=110.0, mean_hold_s_by_replica={"r0": 12.0, "r1": 1.0})
    wait = owner_wait(request(slo_ttft_s=10.0), views, index_with(r0=10), state)
    assert wait is not None and wait.expected_wait_s == pytest.approx(3.0)  # 1 × 12 / 4, not 8 / 4
    assert wait.until_s == pytest.approx(107.0)  # 10 − 3
    slow = queue(deadline_s=110.0, mean_hold_s_by_replica={"r0": 18.0})
    assert owner_wait(request(), views, index_with(r0=10), slow) is None  # 4.5 s > the 4 s objective


@pytest.mark.parametrize(
    ("why", "by_replica"),
    [
        ("no samples yet for any replica", {}),
        ("samples for others only (the owner is new)", {"r1": 40.0}),
        ("a removed replica's mean is never read", {"gone": 40.0}),
        ("a nonsensical own mean", {"r0": 0.0}),
    ],
)
def test_without_a_usable_own_mean_the_pool_mean_is_used(why: str, by_replica: dict[str, float]) -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    state = queue(deadline_s=110.0, mean_hold_s_by_replica=by_replica)
    wait = owner_wait(request(), views, index_with(r0=10, gone=10), state)
    assert wait is not None and wait.replica_id == "r0", why
    assert wait.expected_wait_s == pytest.approx(2.0), why  # 1 × 8 / 4


def test_between_equal_matches_the_replica_that_frees_slots_faster_is_waited_for() -> None:
    views = fleet(("r0", "r1", "r2"), r0=FULL, r1=FULL, r2=FREE)
    state = queue(deadline_s=110.0, mean_hold_s_by_replica={"r0": 4.0, "r1": 16.0})
    wait = owner_wait(request(slo_ttft_s=10.0), views, index_with(r0=10, r1=10), state)
    assert wait is not None and wait.replica_id == "r0" and wait.expected_wait_s == pytest.approx(1.0)
    state = queue(deadline_s=110.0, mean_hold_s_by_replica={"r0": 16.0, "r1": 4.0})
    wait = owner_wait(request(slo_ttft_s=10.0), views, index_with(r0=10, r1=10), state)
    assert wait is not None and wait.replica_id == "r1"


# --- a key's owner (the rings: prefix-affinity, session-affinity) -------------------------------------


def test_waits_for_the_keys_full_owner_its_witness_credits() -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    wait = key_owner_wait(request(), views, KeyOwner("r0", 10), queue(deadline_s=103.0))
    # the same budget as an index's owner: W = 1 × 8 / 4 = 2 s, slack = min(4 − 2, 103 − 100 − 2) = 1
    assert wait == OwnerWait("r0", until_s=101.0, expected_wait_s=2.0, predicted_ttft_s=0.0)


@pytest.mark.parametrize(
    ("why", "matched"),
    [
        ("another instance's requests keep it warm: this one's witness saw none of it go there", 0),
        ("the witness saw under half of it", 4),
    ],
)
def test_waits_for_the_keys_full_owner_whatever_its_witness_saw(why: str, matched: int) -> None:
    views = fleet(("r0", "r1"), r0=FULL, r1=FREE)
    wait = key_owner_wait(request(), views, KeyOwner("r0", matched), queue(deadline_s=103.0))
    assert wait == OwnerWait("r0", until_s=101.0, expected_wait_s=2.0, predicted_ttft_s=0.0), why


def test_the_witness_blocks_price_the_keys_owners_predicted_ttft() -> None:
    """Own uncached tokens at a4 = 1 s per 1,000: the witness saw all 10 blocks (160 tokens cached,
    T = 0.5) or none (T = 0.5 + 0.16); the wait keeps T inside the objective either way."""
    model = LatencyEstimate(ttft=(0.5, 0.0, 0.0, 0.0, 1.0, 0.0))
    views = fleet(("r0", "r1"), r0={**FULL, "latency": model}, r1=FREE)
    warm = key_owner_wait(request(), views, KeyOwner("r0", 10), queue(deadline_s=110.0))
    cold = key_owner_wait(request(), views, KeyOwner("r0", 0), queue(deadline_s=110.0))
    assert warm is not None and warm.predicted_ttft_s == pytest.approx(0.5)
    assert cold is not None and cold.predicted_ttft_s == pytest.approx(0.66)
    assert cold.until_s == pytest.approx(100.0 + 4.0 - 2.0 - 0.66)


@pytest.mark.parametrize(
    ("why", "owner", "views"),
    [
        ("the owner has a free slot", KeyOwner("r0", 10), {"r0": FREE, "r1": FREE}),
        ("nothing free elsewhere", KeyOwner("r0", 10), {"r0": FULL, "r1": FULL}),
        ("the owner is not a candidate (down)", KeyOwner("r0", 10), {"r0": {**FULL, "healthy": False}}),
        ("the owner is not in the snapshot", KeyOwner("r9", 10), None),
    ],
)
def test_spills_without_a_keyed_owner_worth_waiting_for(
    why: str, owner: KeyOwner, views: dict[str, Any] | None
) -> None:
    snapshot = fleet(("r0", "r1"), **{"r0": FULL, "r1": FREE, **(views or {})})
    assert key_owner_wait(request(), snapshot, owner, queue(deadline_s=110.0)) is None, why


def test_the_ring_names_its_keys_owner_full_or_not_with_the_blocks_its_witness_saw() -> None:
    ring = policy("prefix-affinity")
    assert isinstance(ring, Profile) and ring.routes_on_key
    routed = prefix_request(prefix_hashes=HASHES, block_size_chars=1024)  # stride 1: every block
    assert routed.prefix_key is not None
    order = ring_order(routed.prefix_key)
    views = fleet()
    assert ring.key_owner(routed, views) == KeyOwner(order[0], 0)  # cold: nothing seen yet
    decided(ring.decide(routed, views))
    full = fleet(**{order[0]: FULL})
    assert ring.key_owner(routed, full) == KeyOwner(order[0], len(HASHES), under_bound=False), (
        "full, still the owner — over the bound: it runs every request of the fleet"
    )
    loaded = fleet(**{rid: FULL if rid == order[0] else FREE | {"inflight_requests": 3} for rid in order})
    assert ring.key_owner(routed, loaded) == KeyOwner(order[0], len(HASHES), under_bound=True), (
        "full by its cap, under the bound ceil(1.25 × (4 + 3 × 3 + 1) / 4) = 5"
    )
    retry = replace(routed, exclude=frozenset({order[0]}))
    assert ring.key_owner(retry, full) == KeyOwner(order[1], 0), "excluded: the next one clockwise"
    assert ring.key_owner(replace(routed, prefix_key=None), full) is None, "no key, no owner"


def test_a_policy_that_routes_on_no_key_names_no_owner() -> None:
    index_policy = policy("prefix-index")
    assert isinstance(index_policy, Profile) and not index_policy.routes_on_key
    assert index_policy.key_owner(prefix_request(prefix_hashes=HASHES), fleet()) is None
