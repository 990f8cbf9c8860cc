"""Property tests for routing: the load bound, the ring's stability, eligibility, the index's bounds."""

from __future__ import annotations

import random
import string

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from router.bounded import LoadBound
from router.eligibility import eligible_replicas
from router.load import LoadUnit
from router.prefix_index import PrefixIndex
from router.presets import PolicyContext, build_policy, known_policies
from router.ring import HashRing
from router.types import Branch, EngineLoad, ReplicaView, RoutingRequest

PROPERTY_SETTINGS = settings(
    deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
RING_POLICIES = ("prefix-affinity", "session-affinity")
HASH = st.integers(min_value=0, max_value=2**64 - 1)
REPLICA_ID = st.text(alphabet=string.ascii_lowercase + string.digits + "-.:", min_size=1, max_size=12)
SAMPLED_KEYS = 4000


@st.composite
def replicas(draw: st.DrawFn, ids: list[str]) -> list[ReplicaView]:
    mostly_true = st.integers(0, 3).map(lambda n: n > 0)
    return [
        ReplicaView(
            replica_id=replica_id,
            url=f"http://{replica_id}",
            healthy=draw(mostly_true),
            draining=not draw(mostly_true),
            breaker_open=not draw(mostly_true),
            inflight_requests=draw(st.integers(0, 40)),
            inflight_tokens=draw(st.integers(0, 200_000)),
            max_concurrency=draw(st.none() | st.integers(1, 40)),
            engine=draw(st.none() | st.builds(EngineLoad, waiting=st.floats(0, 50), stale=st.booleans())),
        )
        for replica_id in ids
    ]


@st.composite
def snapshots(draw: st.DrawFn, max_size: int = 10) -> list[ReplicaView]:
    ids = draw(st.lists(REPLICA_ID, min_size=0, max_size=max_size, unique=True))
    return draw(replicas(ids))


@st.composite
def requests(draw: st.DrawFn, ids: list[str]) -> RoutingRequest:
    prefix_hashes = tuple(draw(st.lists(HASH, max_size=6)))
    return RoutingRequest(
        model="m",
        estimated_prompt_tokens=draw(st.integers(0, 8000)),
        max_tokens=draw(st.none() | st.integers(0, 2000)),
        session_key=draw(st.none() | st.text(max_size=10)),
        exclude=draw(st.frozensets(st.sampled_from(ids))) if ids else frozenset(),
        prefix_hashes=prefix_hashes,
        prefix_key=prefix_hashes[min(2, len(prefix_hashes)) - 1] if prefix_hashes else None,
    )


@PROPERTY_SETTINGS
@given(
    data=st.data(),
    name=st.sampled_from(RING_POLICIES),
    load_factor=st.floats(1.0, 3.0),
    unit=st.sampled_from(list(LoadUnit)),
)
def test_no_decision_exceeds_the_bound_unless_all_were_over(
    data: st.DataObject, name: str, load_factor: float, unit: LoadUnit
) -> None:
    snapshot = data.draw(snapshots())
    request = data.draw(requests([r.replica_id for r in snapshot]))
    bound = LoadBound(load_factor, unit)
    policy = build_policy(
        name, PolicyContext(random.Random(0), {"load_factor": load_factor, "load_unit": str(unit)})
    )
    decision = policy.decide(request, snapshot)
    eligible = eligible_replicas(request, snapshot)
    if not eligible:
        assert decision is None
        return
    assert decision is not None
    limit = bound.limit(request, eligible)
    chosen = next(r for r in eligible if r.replica_id == decision.replica_id)
    any_admits = any(bound.admits(r, limit) for r in eligible)
    assert (decision.branch is Branch.ALL_OVER_BOUND) is (not any_admits)
    if decision.branch is not Branch.ALL_OVER_BOUND:
        assert bound.admits(chosen, limit)


@PROPERTY_SETTINGS
@given(data=st.data(), load_factor=st.floats(1.0, 3.0))
def test_spillover_walks_the_ring_and_never_jumps(data: st.DataObject, load_factor: float) -> None:
    snapshot = data.draw(snapshots())
    request = data.draw(requests([r.replica_id for r in snapshot]))
    assume(request.prefix_key is not None)
    policy = build_policy("prefix-affinity", PolicyContext(random.Random(0), {"load_factor": load_factor}))
    decision = policy.decide(request, snapshot)
    assume(decision is not None and decision.branch in (Branch.RING_HIT, Branch.SPILLOVER))
    assert decision is not None and request.prefix_key is not None
    eligible = eligible_replicas(request, snapshot)
    bound = LoadBound(load_factor)
    limit = bound.limit(request, eligible)
    admitted = {r.replica_id for r in eligible if bound.admits(r, limit)}
    order = list(HashRing(r.replica_id for r in snapshot).walk(request.prefix_key))
    assert order[decision.detail.get("hops", 0)] == decision.replica_id
    assert not admitted.intersection(order[: decision.detail.get("hops", 0)])


@PROPERTY_SETTINGS
@given(
    ids=st.lists(REPLICA_ID, min_size=2, max_size=16, unique=True),
    changed=st.integers(min_value=0),
    seed=st.integers(),
)
def test_adding_or_removing_one_of_n_replicas_moves_at_most_1_5_over_n(
    ids: list[str], changed: int, seed: int
) -> None:
    leaving = ids[changed % len(ids)]
    full, reduced = HashRing(ids), HashRing(r for r in ids if r != leaving)
    rng = random.Random(seed)
    keys = [rng.getrandbits(64) for _ in range(SAMPLED_KEYS)]
    moved = [key for key in keys if full.owner(key) != reduced.owner(key)]
    assert all(full.owner(key) == leaving for key in moved)
    assert len(moved) / SAMPLED_KEYS <= 1.5 / len(ids)


@PROPERTY_SETTINGS
@given(
    ids=st.lists(REPLICA_ID, min_size=1, max_size=12, unique=True),
    data=st.data(),
    keys=st.lists(HASH, min_size=1, max_size=50),
)
def test_two_rings_from_the_same_ids_agree_on_every_key(
    ids: list[str], data: st.DataObject, keys: list[int]
) -> None:
    shuffled = data.draw(st.permutations(ids))
    first, second = HashRing(ids), HashRing([*shuffled, *shuffled[:2]])
    for key in keys:
        assert list(first.walk(key)) == list(second.walk(key))


@PROPERTY_SETTINGS
@given(data=st.data(), name=st.sampled_from(known_policies()), seed=st.integers(0, 2**32))
def test_no_policy_ever_picks_an_ineligible_replica(data: st.DataObject, name: str, seed: int) -> None:
    policy = build_policy(name, PolicyContext(random.Random(seed)))
    for _ in range(data.draw(st.integers(1, 6))):
        snapshot = data.draw(snapshots())
        request = data.draw(requests([r.replica_id for r in snapshot]))
        decision = policy.decide(request, snapshot)
        eligible_ids = {r.replica_id for r in eligible_replicas(request, snapshot)}
        if not eligible_ids:
            assert decision is None
            continue
        assert decision is not None
        assert decision.replica_id in eligible_ids
        assert decision.candidates == len(eligible_ids)
        assert decision.policy == name


@PROPERTY_SETTINGS
@given(
    ids=st.lists(REPLICA_ID, min_size=2, max_size=10, unique=True),
    down=st.integers(min_value=0),
    keys=st.lists(HASH, min_size=1, max_size=40),
)
def test_a_health_flap_moves_only_the_keys_of_the_flapping_replica(
    ids: list[str], down: int, keys: list[int]
) -> None:
    flapping = ids[down % len(ids)]
    policy = build_policy("prefix-affinity", PolicyContext(random.Random(0)))
    healthy = [ReplicaView(r, f"http://{r}") for r in ids]
    degraded = [ReplicaView(r, f"http://{r}", healthy=r != flapping) for r in ids]
    for key in keys:
        request = RoutingRequest(model="m", prefix_key=key)
        before, during = policy.decide(request, healthy), policy.decide(request, degraded)
        assert before is not None and during is not None
        if before.replica_id != flapping:
            assert during.replica_id == before.replica_id
        assert during.replica_id != flapping


@PROPERTY_SETTINGS
@given(
    capacity=st.integers(1, 8),
    max_replicas=st.integers(1, 4),
    operations=st.lists(
        st.tuples(st.sampled_from("abcdef"), st.lists(st.integers(0, 40), max_size=12, unique=True)),
        max_size=40,
    ),
)
def test_the_prefix_index_never_exceeds_its_bounds(
    capacity: int, max_replicas: int, operations: list[tuple[str, list[int]]]
) -> None:
    index = PrefixIndex(capacity_blocks_per_replica=capacity, max_replicas=max_replicas)
    for replica_id, hashes in operations:
        index.record(replica_id, hashes)
        assert len(index.replica_ids()) <= max_replicas
        assert all(index.blocks(r) <= capacity for r in index.replica_ids())
        if hashes:
            assert index.matched_blocks(replica_id, hashes) == min(len(hashes), capacity)
