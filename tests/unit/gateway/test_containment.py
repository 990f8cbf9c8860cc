"""Poison containment across requests (gateway.proxy.containment): identical requests that fail on two
working replicas are quarantined without a second try, their replicas are not charged, and the load
and down-replica guards still hold."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from admission.ticket import SlotRole
from core.clock import FakeClock
from gateway.api.request_parsing import Endpoint, ParsedRequest, parse_request
from gateway.base.errors import RequestQuarantined, UpstreamError, UpstreamStatusError, UpstreamTTFTTimeout
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.containment import Containment, build_containment
from gateway.proxy.failure_attribution import RequestFailures
from gateway.proxy.failure_charges import FailureCause
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import Replica
from router.types import EngineLoad, RoutingRequest

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
HOLD_S = 10.0


@dataclass(frozen=True)
class _Ctx:
    """The part of a `RequestContext` the containment reads."""

    parsed: ParsedRequest
    pool: Pool
    routing: RoutingRequest

    @property
    def model(self) -> str:
        return self.pool.model


class Fleet:
    def __init__(self, **pool: Any) -> None:
        self.clock = FakeClock(start_s=1000.0)
        settings = parse_settings({"pools": [{"model": "m", "replicas": {"static": URLS}, **pool}]})
        self.metrics = GatewayMetrics()
        registry = ReplicaRegistry(settings, self.metrics, self.clock, random.Random(0))
        self.pool = registry.pools["m"]
        self.containment: Containment = build_containment([self.pool], None, self.clock, self.metrics)[0]
        self.a, self.b, self.c = self.pool.replicas.values()

    def ctx(self, text: str) -> Any:
        raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
        return _Ctx(parse_request(Endpoint.CHAT, raw), self.pool, RoutingRequest(model="m"))

    def serving(self, *replicas: Replica) -> None:
        for replica in replicas:
            replica.last_success_s = self.clock.now_s() - 1.0

    def count(self, outcome: str) -> float:
        return float(self.metrics.quarantine_total.labels("m", outcome)._value.get())


def _arrive(fleet: Fleet, ctx: Any) -> tuple[Any, RequestFailures]:
    """An aggregated pool's arrival: its one set, in the SERVE role."""
    arrived, failures = fleet.containment.arrive(ctx, {SlotRole.SERVE: fleet.pool})
    return arrived, failures[SlotRole.SERVE]


def _status(status: int, replica: Replica | None = None) -> UpstreamError:
    replica_id = None if replica is None else replica.replica_id
    return UpstreamStatusError(
        "engine error", status=status, body=b"{}", content_type=None, replica_id=replica_id
    )


def _500(replica: Replica) -> UpstreamError:
    return _status(500, replica)


def causes(charges: tuple[Any, ...] | list[Any]) -> list[tuple[str, FailureCause]]:
    return sorted((c.replica.replica_id, c.cause) for c in charges)


def one_try(
    fleet: Fleet, text: str, replica: Replica, error: UpstreamError | None = None
) -> tuple[Any, RequestFailures, Any, tuple[Any, ...]]:
    """Arrive, fail once on `replica`, end unserved: (context, failures, verdict, settled charges)."""

    async def run() -> tuple[Any, RequestFailures, Any, tuple[Any, ...]]:
        ctx, failures = _arrive(fleet, fleet.ctx(text))
        failure = error or _500(replica)
        verdict = await fleet.containment.judge(ctx, failures, failure, replica, ctx.pool)
        if verdict.quarantine:
            await fleet.containment.quarantine(ctx, failures, failure)
        settled = await fleet.containment.settle(ctx, failures, ctx.pool, served=False)
        return ctx, failures, verdict, settled

    return asyncio.run(run())


def test_identical_requests_failing_on_two_working_replicas_are_quarantined_without_a_second_try() -> None:
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b, fleet.c)
    _, _, first, settled = one_try(fleet, "poison", fleet.a)
    assert first.pending and not first.quarantine
    assert settled == (), "held: not charged to the replica when the request ends"
    ctx, _, second, _ = one_try(fleet, "poison", fleet.b)
    assert fleet.a.replica_id in ctx.routing.exclude, "routed away from where it failed"
    assert fleet.count("rerouted") == 1
    assert second.quarantine
    assert causes(second.charges) == [
        (fleet.a.replica_id, FailureCause.REQUEST),
        (fleet.b.replica_id, FailureCause.REQUEST),
    ], "both failures are the request's: the held one is released"
    with pytest.raises(RequestQuarantined):
        _arrive(fleet, fleet.ctx("poison"))
    assert fleet.count("quarantined") == 1 and fleet.count("refused") == 1
    fleet.clock.advance(HOLD_S + 1)
    assert one_try(fleet, "good", fleet.c, _status(400))[3] == (), "nothing left held for A"


def test_identical_requests_failing_at_once_complete_the_evidence_when_the_second_ends() -> None:
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)

    async def run() -> tuple[Any, ...]:
        one, f1 = _arrive(fleet, fleet.ctx("poison"))
        two, f2 = _arrive(fleet, fleet.ctx("poison"))
        assert (await fleet.containment.judge(one, f1, _500(fleet.a), fleet.a, one.pool)).pending
        assert (await fleet.containment.judge(two, f2, _500(fleet.b), fleet.b, two.pool)).pending
        assert await fleet.containment.settle(one, f1, one.pool, served=False) == ()
        return await fleet.containment.settle(two, f2, two.pool, served=False)

    charges = asyncio.run(run())
    assert causes(charges) == [
        (fleet.a.replica_id, FailureCause.REQUEST),
        (fleet.b.replica_id, FailureCause.REQUEST),
    ]
    assert fleet.count("listed") == 1
    with pytest.raises(RequestQuarantined):
        _arrive(fleet, fleet.ctx("poison"))


def test_a_held_failure_is_the_replicas_when_its_fingerprint_fails_nowhere_else() -> None:
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)
    assert one_try(fleet, "flaky here", fleet.a)[3] == ()
    fleet.clock.advance(HOLD_S + 1)
    _, _, _, later = one_try(fleet, "another prompt", fleet.b, _status(400))
    assert (fleet.a.replica_id, FailureCause.REPLICA) in causes(later), "charged at the end of its hold"


def test_a_held_failure_is_the_requests_when_its_replica_served_others_since() -> None:
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)
    one_try(fleet, "odd prompt", fleet.a)
    fleet.clock.advance(1.0)
    fleet.a.last_success_s = fleet.clock.now_s()
    fleet.clock.advance(HOLD_S)
    later = one_try(fleet, "another prompt", fleet.b, _status(400))[3]
    assert (fleet.a.replica_id, FailureCause.REQUEST) in causes(later)


def test_a_genuinely_broken_replica_is_still_charged_for_every_failure() -> None:
    """Distinct prompts fail on one replica that serves nobody since: each is its failure, one hold
    later; a request it failed that another replica serves charges it at once."""
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)
    for i in range(3):
        assert one_try(fleet, f"good {i}", fleet.a)[3] == ()
    fleet.clock.advance(HOLD_S + 1)
    later = one_try(fleet, "a 400", fleet.b, _status(400))[3]
    assert causes(later).count((fleet.a.replica_id, FailureCause.REPLICA)) == 3

    async def served_elsewhere() -> tuple[Any, ...]:
        ctx, failures = _arrive(fleet, fleet.ctx("good 9"))
        await fleet.containment.judge(ctx, failures, _500(fleet.a), fleet.a, ctx.pool)
        return await fleet.containment.settle(ctx, failures, ctx.pool, served=True)

    assert causes(asyncio.run(served_elsewhere())) == [(fleet.a.replica_id, FailureCause.REPLICA)]


def test_a_prompt_served_somewhere_is_no_poison_request() -> None:
    """A popular prompt in a partly saturated pool misses a first token on one replica, is served on
    another, then misses on a third: its sightings were cleared, it is not quarantined."""
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b, fleet.c)
    miss = UpstreamTTFTTimeout("late")
    one_try(fleet, "popular", fleet.a, miss)

    async def served() -> None:
        ctx, failures = _arrive(fleet, fleet.ctx("popular"))
        await fleet.containment.settle(ctx, failures, ctx.pool, served=True)

    asyncio.run(served())
    _, _, verdict, _ = one_try(fleet, "popular", fleet.c, miss)
    assert not verdict.quarantine and fleet.count("listed") == 0


def test_missed_first_tokens_on_saturated_engines_are_load_not_evidence() -> None:
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)
    fleet.a.engine = fleet.b.engine = EngineLoad(waiting=3.0)
    miss = UpstreamTTFTTimeout("late")
    _, _, _, settled = one_try(fleet, "slow", fleet.a, miss)
    assert causes(settled) == [(fleet.a.replica_id, FailureCause.LOAD)], "charged to load, not held"
    _, _, second, _ = one_try(fleet, "slow", fleet.b, miss)
    assert not second.quarantine and fleet.count("listed") == 0


def test_a_stream_silent_where_other_streams_go_silent_too_is_not_quarantined() -> None:
    """Both replicas silenced other prompts' streams in the window (load, engine metrics off): two
    identical requests silenced on them are not a poison request."""
    from gateway.base.errors import UpstreamIdleTimeout

    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)
    silent = UpstreamIdleTimeout("quiet")
    for replica in (fleet.a, fleet.b):

        async def other(replica: Replica = replica) -> None:
            ctx, failures = _arrive(fleet, fleet.ctx(f"other on {replica.replica_id}"))
            await fleet.containment.judge(ctx, failures, silent, replica, ctx.pool)

        asyncio.run(other())
    one_try(fleet, "same", fleet.a, silent)
    _, _, verdict, _ = one_try(fleet, "same", fleet.b, silent)
    assert not verdict.quarantine and fleet.count("listed") == 0


def test_a_replica_that_went_down_is_no_evidence() -> None:
    fleet = Fleet()
    fleet.serving(fleet.a, fleet.b)
    one_try(fleet, "hello", fleet.a)
    fleet.a.active_up = False  # killed: its health check fails
    _, _, verdict, _ = one_try(fleet, "hello", fleet.b)
    assert not verdict.quarantine and fleet.count("listed") == 0


def test_without_quarantine_failures_settle_when_the_request_ends() -> None:
    fleet = Fleet(quarantine={"enabled": False})
    fleet.serving(fleet.a)
    _, failures, _, settled = one_try(fleet, "poison", fleet.a)
    assert failures.fingerprint is None
    assert causes(settled) == [(fleet.a.replica_id, FailureCause.REPLICA)], "as before: no hold"
