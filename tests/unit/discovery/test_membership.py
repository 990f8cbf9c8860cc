"""How the registry consumes discovery events: `plan_membership`, and a toy registry that applies plans
and counts ring rebuilds (once per membership change; draining keeps the ring and the in-flight requests)."""

from __future__ import annotations

from gateway.upstream.discovery.membership import MembershipPlan, plan_membership
from gateway.upstream.discovery.types import Emitter, ReplicaSet

A, B, C = "http://a:1", "http://b:1", "http://c:1"


class ToyRegistry:
    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self.draining: set[str] = set()
        self.pending_removal: set[str] = set()
        self.ring_builds = 0
        self._ring_members: frozenset[str] = frozenset()

    def routable(self) -> set[str]:
        return set(self.inflight) - self.draining

    def decide(self) -> None:
        """What `router.ring.RingCache` does on each decision: rebuild when the id set changed."""
        if frozenset(self.inflight) != self._ring_members:
            self._ring_members = frozenset(self.inflight)
            self.ring_builds += 1

    def on_change(self, target: ReplicaSet) -> None:
        plan = plan_membership(self.inflight, target, frozenset(self.draining))
        for url in plan.add:
            self.inflight[url] = 0
        self.draining |= plan.mark_draining
        self.draining -= plan.mark_ready
        for url in plan.remove:
            del self.inflight[url]
            self.draining.discard(url)
        self.pending_removal = set(plan.remove_when_idle)

    def release(self, url: str) -> None:
        self.inflight[url] -= 1
        if self.inflight[url] == 0 and url in self.pending_removal:
            del self.inflight[url]
            self.draining.discard(url)
            self.pending_removal.discard(url)


def test_plan_of_each_transition() -> None:
    target = ReplicaSet.of(ready=[A, C], draining=[B])
    assert plan_membership({}, target) == MembershipPlan(add=frozenset({A, C}))
    plan = plan_membership({A: 0, B: 2, "http://gone:1": 0, "http://busy:1": 3}, target)
    assert plan.add == {C} and plan.mark_draining == {B, "http://busy:1"}
    assert plan.remove == {"http://gone:1"} and plan.remove_when_idle == {"http://busy:1"}
    assert plan.changed and plan.membership_changed
    assert not plan_membership({A: 0}, ReplicaSet.of(draining=[A])).membership_changed
    assert plan_membership({A: 1, B: 0}, ReplicaSet.of(ready=[A, B]), frozenset({B})).mark_ready == {B}


def test_repeated_set_is_an_empty_plan() -> None:
    target = ReplicaSet.of(ready=[A], draining=[B])
    plan = plan_membership({A: 0, B: 1}, target, frozenset({B}))
    assert not plan.changed and plan == MembershipPlan()


def test_toy_registry_drains_before_dropping_and_rebuilds_once_per_change() -> None:
    registry = ToyRegistry()
    emitter = Emitter(registry.on_change)
    emitter.emit(ReplicaSet.of(ready=[A, B, C]))  # three replicas at once: one rebuild
    registry.decide()
    assert registry.routable() == {A, B, C} and registry.ring_builds == 1

    registry.inflight[B] = 2  # two streams on B
    emitter.emit(ReplicaSet.of(ready=[A, B, C]))  # same set: not even delivered
    emitter.emit(ReplicaSet.of(ready=[A, C], draining=[B]))  # B terminating
    registry.decide()
    assert registry.routable() == {A, C} and registry.inflight[B] == 2
    assert registry.ring_builds == 1  # draining changes eligibility, not the ring

    emitter.emit(ReplicaSet.of(ready=[A]))  # B deleted while its streams run, C gone idle
    registry.decide()
    assert B in registry.inflight and C not in registry.inflight and registry.ring_builds == 2
    registry.release(B)
    registry.release(B)
    registry.decide()
    assert B not in registry.inflight and registry.ring_builds == 3  # dropped once idle, never mid-stream

    emitter.emit(ReplicaSet.of(ready=[A, B]))  # B back (a new pod on a reused IP)
    registry.decide()
    assert registry.routable() == {A, B} and registry.ring_builds == 4
    assert emitter.emitted_total == 4
