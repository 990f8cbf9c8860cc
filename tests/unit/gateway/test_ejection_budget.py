"""The pool's ejection budget and panic mode (issue 14), on a `ReplicaRegistry` built from settings with a
fake clock: outcomes are reported the way the serve path reports them (`record_failure` /
`record_success`), routing runs the pool's own policy over `Pool.snapshot`, as `Router.decide` does."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.ops.admin import _replica_status
from gateway.upstream.breaker import BreakerState
from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import Replica
from router.types import RoutingRequest

MODEL = "m"
TRIP_AFTER = 2  # breaker.consecutive_failures
OPEN_S = 5.0


class Fixture:
    def __init__(self, replicas: int, **breaker: Any) -> None:
        settings = parse_settings(
            {
                "pools": [
                    {
                        "model": MODEL,
                        "policy": "round-robin",
                        "replicas": {"static": [f"http://10.0.0.{i + 1}:8000" for i in range(replicas)]},
                        "breaker": {"consecutive_failures": TRIP_AFTER, "open_s": OPEN_S, **breaker},
                    }
                ]
            }
        )
        self.clock = FakeClock(100.0)
        self.metrics = GatewayMetrics()
        self.registry = ReplicaRegistry(settings, self.metrics, self.clock, random.Random(1))
        self.pool: Pool = self.registry.pools[MODEL]
        self.replicas: list[Replica] = list(self.pool.replicas.values())

    def fail(
        self, replica: Replica, times: int = TRIP_AFTER, kind: FailureKind = FailureKind.STATUS_5XX
    ) -> None:
        for _ in range(times):
            self.registry.record_failure(replica, kind)

    def down(self, replica: Replica, down: bool = True) -> None:
        self.registry.set_active_health(replica, not down, None)

    def refused(self) -> float:
        return float(self.metrics.ejections_refused_total.labels(MODEL)._value.get())

    def panic_gauge(self) -> float:
        return float(self.metrics.pool_panic.labels(MODEL)._value.get())

    def panic_decisions(self) -> float:
        return float(self.metrics.panic_decisions_total.labels(MODEL)._value.get())

    def route(self, requests: int) -> list[str]:
        """`requests` decisions as the serve path makes them (snapshot → policy → claim), each released."""
        chosen = []
        for _ in range(requests):
            decision = self.pool.policy.decide(RoutingRequest(MODEL), self.pool.snapshot())
            assert decision is not None
            slot = self.registry.claim(self.pool.replicas[decision.replica_id], decision, 10)
            chosen.append(decision.replica_id)
            slot.release()
        return chosen


# --- the budget ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 10])
@pytest.mark.parametrize(
    ("ratio", "budgets"), [(0.0, (0, 1, 1, 1, 1)), (0.5, (0, 1, 1, 2, 5)), (1.0, (1, 2, 3, 4, 10))]
)
def test_every_replica_failing_ejects_at_most_the_budget(
    replicas: int, ratio: float, budgets: tuple[int, ...]
) -> None:
    budget = budgets[(1, 2, 3, 4, 10).index(replicas)]
    f = Fixture(replicas, max_ejected_ratio=ratio, panic_threshold=0)
    assert f.pool.ejection_budget() == budget
    for replica in f.replicas:
        f.fail(replica)
    assert f.pool.ejected_count() == budget
    assert [r.breaker.state for r in f.replicas].count(BreakerState.OPEN) == budget
    assert f.refused() == replicas - budget, "one refused trip per replica the budget kept closed"
    assert f.pool.has_eligible_replica() is (budget < replicas)


def test_a_lone_replica_is_never_ejected_by_default() -> None:
    """budget(n = 1) = floor(0.5 × 1) = 0: a single-replica pool keeps serving (and failing over is
    impossible anyway); every failure past the threshold is a refused trip."""
    f = Fixture(1)
    [only] = f.replicas
    f.fail(only, times=10)
    assert only.breaker.state is BreakerState.CLOSED and f.pool.has_eligible_replica()
    assert f.refused() == 10 - TRIP_AFTER + 1


def test_a_freed_budget_lets_the_next_trip_happen_at_the_next_failure() -> None:
    f = Fixture(3)  # budget 1
    a, b, _ = f.replicas
    f.fail(a)
    f.fail(b, times=3)
    assert (state(a), state(b)) == (BreakerState.OPEN, BreakerState.CLOSED)
    assert f.refused() == 2
    f.clock.advance(OPEN_S)
    a.breaker.on_dispatch()  # its half-open probe
    f.registry.record_success(a)
    assert state(a) is BreakerState.CLOSED and f.pool.ejected_count() == 0
    f.fail(b, times=1)
    assert state(b) is BreakerState.OPEN, "b kept its streak: one more failure opened it"
    assert f.refused() == 2


def test_half_open_counts_as_ejected_and_its_failed_probe_reopens_without_a_refusal() -> None:
    f = Fixture(2)  # budget 1
    a, b = f.replicas
    f.fail(a)
    f.clock.advance(OPEN_S)
    assert state(a) is BreakerState.HALF_OPEN and a.is_ejected(f.clock.now_s())
    f.fail(b)
    assert state(b) is BreakerState.CLOSED and f.refused() == 1, "half-open still holds the budget"
    a.breaker.on_dispatch()
    f.fail(a, times=1)
    assert state(a) is BreakerState.OPEN and f.refused() == 1, "the probe failing re-opens it"


def test_a_down_replica_is_not_ejected_and_uses_none_of_the_budget() -> None:
    f = Fixture(3)  # budget 1
    a, b, c = f.replicas
    f.fail(a, times=TRIP_AFTER, kind=FailureKind.CONNECT)  # refuses connections: held out, down
    assert state(a) is BreakerState.OPEN and a.is_down(f.clock.now_s())
    f.clock.advance(60)  # past every hold: still down until a request there succeeds
    assert a.is_down(f.clock.now_s()) and not a.is_ejected(f.clock.now_s())
    f.fail(b)
    assert b.is_ejected(f.clock.now_s()) and f.refused() == 0, "the connect failures used no budget"
    f.down(b)  # the ejected replica then fails its health check: down now, the budget frees
    f.fail(c)
    assert c.is_ejected(f.clock.now_s()) and f.refused() == 0
    f.down(b, down=False)
    assert f.pool.ejected_count() == 2, "back up with its breaker still open: counted again at once"


def test_a_draining_replica_frees_the_budget_and_n_counts_every_replica() -> None:
    f = Fixture(4)  # budget 2
    a, b, c, d = f.replicas
    f.down(c)
    f.registry.set_draining(d, True)
    assert f.pool.ejection_budget() == 2, "n = every replica of the pool, down and draining ones included"
    f.fail(a)
    f.registry.set_draining(a, True)
    assert not a.is_ejected(f.clock.now_s()) and f.pool.ejected_count() == 0
    f.fail(b)
    assert b.is_ejected(f.clock.now_s()) and f.refused() == 0


# --- panic mode ----------------------------------------------------------------------------------------


def test_panic_is_entered_and_left_at_the_threshold_with_replicas_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    f = Fixture(4)  # panic when fewer than 0.5 × 4 = 2 non-draining replicas are routable
    a, b, c, _ = f.replicas
    caplog.set_level(logging.WARNING)
    f.down(a)
    f.down(b)
    assert not f.pool.in_panic() and f.panic_gauge() == 0, "2 of 4 routable: at the threshold, not under"
    f.down(c)
    assert f.pool.panic and f.panic_gauge() == 1, "1 of 4 routable: a state change publishes the flag"
    assert "pool m enters panic mode: 1 of 4 non-draining replicas routable" in caplog.text
    f.down(c, down=False)
    assert not f.pool.panic and f.panic_gauge() == 0
    assert "pool m leaves panic mode: 2 of 4" in caplog.text


def test_draining_replicas_do_not_count_towards_the_threshold() -> None:
    f = Fixture(4)
    a, b, c, _ = f.replicas
    f.registry.set_draining(a, True)
    f.registry.set_draining(b, True)
    f.down(c)
    assert not f.pool.panic, "1 of 2 non-draining replicas routable: not under 0.5 × 2 (it would be of 4)"
    f.registry.set_draining(a, False)
    f.down(a)
    assert f.pool.panic, "1 of 3 non-draining routable"


def test_a_passive_hold_ending_is_seen_by_the_next_snapshot() -> None:
    f = Fixture(2, panic_threshold=1.0)
    a, _ = f.replicas
    f.registry.record_failure(a, FailureKind.OVERLOADED, retry_after_s=3)
    assert f.pool.panic and f.panic_gauge() == 1
    f.clock.advance(3)
    f.pool.snapshot()
    assert not f.pool.panic and f.panic_gauge() == 0


def test_decisions_in_panic_reach_ejected_replicas_but_never_down_or_draining_ones() -> None:
    f = Fixture(5, max_ejected_ratio=0.4)  # budget 2; panic under 2.5 routable of 5
    a, b, c, d, e = f.replicas
    f.fail(a)
    f.fail(b)
    assert not f.pool.panic and set(f.route(6)) == {c.replica_id, d.replica_id, e.replica_id}
    assert f.panic_decisions() == 0
    f.down(c)
    f.registry.set_draining(d, True)
    assert f.pool.panic, "1 of 4 non-draining routable"
    chosen = f.route(12)
    assert set(chosen) == {a.replica_id, b.replica_id, e.replica_id}, (
        "breakers ignored; down and draining never"
    )
    assert f.panic_decisions() == 12
    assert (state(a), state(b)) == (BreakerState.OPEN, BreakerState.OPEN), (
        "traffic to an open breaker does not move it; its cooldown does"
    )
    status = _replica_status(f.pool, a, f.clock.now_s())
    assert status["ejected"] and status["pool_panic"] and status["eligible"] and status["breaker"] == "open"


def test_has_eligible_replica_agrees_with_panic() -> None:
    f = Fixture(2)  # budget 1; panic under 1 routable of 2
    a, b = f.replicas
    f.fail(a)
    assert f.pool.has_eligible_replica() and not f.pool.panic
    f.down(b)
    assert f.pool.panic and f.pool.has_eligible_replica(), "in panic, the up ejected replica is eligible"
    f.down(a)
    assert not f.pool.has_eligible_replica(), "nothing up: no_replica, panic or not"


def test_without_panic_an_ejected_replica_is_not_eligible() -> None:
    f = Fixture(2, panic_threshold=0)
    a, b = f.replicas
    f.fail(a)
    f.down(b)
    assert not f.pool.in_panic() and not f.pool.has_eligible_replica()
    assert f.pool.retry_after_s() >= 1


def test_a_half_open_breaker_in_panic_takes_traffic_and_the_first_verdict_decides() -> None:
    f = Fixture(2)
    a, b = f.replicas
    f.fail(a)
    f.down(b)
    f.clock.advance(OPEN_S)
    assert state(a) is BreakerState.HALF_OPEN and f.pool.panic
    first = f.registry.claim(a, _decision(f, a), 10)
    second = f.registry.claim(a, _decision(f, a), 10)  # its probe is in flight, yet panic routes here
    f.registry.record_success(a)
    assert state(a) is BreakerState.CLOSED, "the first success closes it"
    first.release()
    second.release()
    f.down(b, down=False)
    assert not f.pool.panic


def state(replica: Replica) -> BreakerState:
    """The breaker's state, read through a call (so that mypy does not narrow it between two reads)."""
    return replica.breaker.state


def _decision(f: Fixture, replica: Replica) -> Any:
    decision = f.pool.policy.decide(RoutingRequest(MODEL), f.pool.snapshot())
    assert decision is not None and decision.replica_id == replica.replica_id
    return decision


def test_panic_threshold_zero_never_panics_and_one_panics_on_any_unroutable_replica() -> None:
    never = Fixture(3, panic_threshold=0)
    for replica in never.replicas:
        never.down(replica)
    assert not never.pool.panic
    eager = Fixture(3, panic_threshold=1.0)
    eager.fail(eager.replicas[0])
    assert eager.pool.panic and len(set(eager.route(6))) == 3
