"""session-affinity: sticky while the owner is eligible and under bound; a preference, never a pin."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from router.ring import hash_key
from router.types import Branch, Decision
from tests.unit.router.snapshots import IDS, decided, fleet, policy, ring_order, session_request

ORDER = ring_order(hash_key("session-42"))


def decide(**per_replica: Mapping[str, object]) -> Decision:
    return decided(policy("session-affinity").decide(session_request(), fleet(**per_replica)))


def test_session_sticks_to_its_owner_across_requests() -> None:
    session_policy = policy("session-affinity")
    decisions = [decided(session_policy.decide(session_request(), fleet())) for _ in range(5)]
    assert {(d.replica_id, d.branch, d.detail.get("hops", 0)) for d in decisions} == {
        (ORDER[0], Branch.SESSION_HIT, 0)
    }
    assert decisions[0].policy == "session-affinity"


def test_different_sessions_spread_over_the_fleet() -> None:
    session_policy = policy("session-affinity")
    owners = {decided(session_policy.decide(session_request(f"s{i}"), fleet())).replica_id for i in range(64)}
    assert owners == set(IDS)


@pytest.mark.parametrize("state", [{"healthy": False}, {"draining": True}, {"breaker_open": True}])
def test_ineligible_owner_breaks_the_session(state: dict[str, object]) -> None:
    decision = decide(**{ORDER[0]: state})
    assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
        ORDER[1],
        Branch.SESSION_BREAK,
        1,
    )


def test_excluded_owner_breaks_the_session_on_retry() -> None:
    request = session_request(exclude=frozenset({ORDER[0]}))
    decision = decided(policy("session-affinity").decide(request, fleet()))
    assert (decision.replica_id, decision.branch) == (ORDER[1], Branch.SESSION_BREAK)


def test_owner_over_bound_breaks_the_session() -> None:
    decision = decide(**{ORDER[0]: {"inflight_requests": 10}})
    assert (decision.replica_id, decision.branch, decision.detail.get("hops", 0)) == (
        ORDER[1],
        Branch.SESSION_BREAK,
        1,
    )


def test_session_returns_to_its_owner_once_it_recovers() -> None:
    session_policy = policy("session-affinity")
    broken = decided(session_policy.decide(session_request(), fleet(**{ORDER[0]: {"healthy": False}})))
    healed = decided(session_policy.decide(session_request(), fleet()))
    assert (broken.branch, healed.branch, healed.replica_id) == (
        Branch.SESSION_BREAK,
        Branch.SESSION_HIT,
        ORDER[0],
    )


def test_no_session_key_routes_by_least_load() -> None:
    loads = {rid: {"inflight_requests": 4} for rid in IDS}
    loads["r3"] = {"inflight_requests": 0}
    decision = decided(policy("session-affinity").decide(session_request(None), fleet(**loads)))
    assert (decision.replica_id, decision.branch) == ("r3", Branch.SESSION_NONE)


def test_every_replica_full_gives_no_decision() -> None:
    full = {rid: {"inflight_requests": 2, "max_concurrency": 2} for rid in IDS}
    assert policy("session-affinity").decide(session_request(), fleet(**full)) is None


def test_session_keys_ignore_the_prefix() -> None:
    session_policy = policy("session-affinity")
    a = decided(session_policy.decide(session_request(prefix_key=1), fleet()))
    b = decided(session_policy.decide(session_request(prefix_key=2**63), fleet()))
    assert a.replica_id == b.replica_id == ORDER[0]
