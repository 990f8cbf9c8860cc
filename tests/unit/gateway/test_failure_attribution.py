"""Every failed attempt is charged to the replica, the request or load (gateway.proxy.failure_attribution)."""

from __future__ import annotations

import random

import pytest

from core.clock import FakeClock
from gateway.base.errors import UpstreamIdleTimeout, UpstreamProtocolError
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.proxy.failure_attribution import PoolAttribution
from gateway.proxy.failure_charges import FailureCause
from gateway.proxy.retry_policy import failure_kind
from gateway.upstream.failure_kinds import FailureKind
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import Replica
from router.types import EngineLoad

URLS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=1000.0)


def make_pool(clock: FakeClock) -> tuple[Pool, PoolAttribution]:
    settings = parse_settings({"pools": [{"model": "m", "replicas": {"static": URLS}}]})
    registry = ReplicaRegistry(settings, GatewayMetrics(), clock, random.Random(0))
    pool = registry.pools["m"]
    return pool, PoolAttribution(pool.settings.attribution, clock)


def replicas(pool: Pool) -> list[Replica]:
    return list(pool.replicas.values())


def serving(clock: FakeClock, *replicas: Replica) -> None:
    for replica in replicas:
        replica.last_success_s = clock.now_s() - 1.0


def causes(verdict_charges: tuple) -> list[tuple[str, FailureCause]]:  # type: ignore[type-arg]
    return [(c.replica.replica_id, c.cause) for c in verdict_charges]


def test_connect_failures_are_always_the_replicas(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, _, _ = replicas(pool)
    serving(clock, a)
    verdict = attribution.for_request().record(FailureKind.CONNECT, a, pool)
    assert causes(verdict.charges) == [(a.replica_id, FailureCause.REPLICA)] and not verdict.quarantine


def test_an_engine_refusing_the_request_is_the_requests_and_overload_is_load(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, _, _ = replicas(pool)
    failures = attribution.for_request()
    assert causes(failures.record(None, a, pool).charges) == [(a.replica_id, FailureCause.REQUEST)]
    assert causes(failures.record(FailureKind.OVERLOADED, a, pool).charges) == [
        (a.replica_id, FailureCause.LOAD)
    ]


def test_a_replica_that_serves_nobody_is_charged_at_once(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, _, _ = replicas(pool)
    a.last_success_s = clock.now_s() - 61.0  # outside the 60 s window
    verdict = attribution.for_request().record(FailureKind.STATUS_5XX, a, pool)
    assert causes(verdict.charges) == [(a.replica_id, FailureCause.REPLICA)]


def test_a_failure_on_a_working_replica_waits_and_is_the_replicas_if_it_does_not_repeat(
    clock: FakeClock,
) -> None:
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    failures = attribution.for_request()
    assert failures.record(FailureKind.STATUS_5XX, a, pool).charges == ()  # pending
    assert failures.record(FailureKind.TTFT_TIMEOUT, b, pool).charges == ()  # another kind: no repeat
    settled = failures.settle(served=True)
    assert sorted(causes(settled)) == sorted(
        [(a.replica_id, FailureCause.REPLICA), (b.replica_id, FailureCause.REPLICA)]
    )
    assert failures.settle(served=True) == (), "charged once"


def test_the_same_failure_on_two_working_replicas_is_a_poison_request(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_BROKEN, a, pool)
    verdict = failures.record(FailureKind.STREAM_BROKEN, b, pool)
    assert verdict.quarantine
    assert causes(verdict.charges) == [
        (a.replica_id, FailureCause.REQUEST),
        (b.replica_id, FailureCause.REQUEST),
    ]
    assert failures.settle(served=True) == (), "nothing left to charge to the replicas"


def test_the_same_replica_twice_is_not_two_replicas(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, _, _ = replicas(pool)
    serving(clock, a)
    failures = attribution.for_request()
    failures.record(FailureKind.STATUS_5XX, a, pool)
    assert not failures.record(FailureKind.STATUS_5XX, a, pool).quarantine


def test_a_missed_first_token_on_a_saturated_engine_is_load(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    a.engine = EngineLoad(waiting=3.0)
    verdict = attribution.for_request().record(FailureKind.TTFT_TIMEOUT, a, pool)
    assert causes(verdict.charges) == [(a.replica_id, FailureCause.LOAD)]
    serving(clock, a, b)
    b.engine = EngineLoad(waiting=3.0)
    failures = attribution.for_request()
    assert failures.record(FailureKind.TTFT_TIMEOUT, a, pool).charges == ()
    again = failures.record(FailureKind.TTFT_TIMEOUT, b, pool)
    assert not again.quarantine, "missed first tokens under load never make a poison request"
    assert [c.cause for c in failures.settle(served=True)] == [FailureCause.LOAD, FailureCause.LOAD]
    a.engine = EngineLoad(waiting=3.0, stale=True)  # an old sample is no evidence
    stale = attribution.for_request()
    stale.record(FailureKind.TTFT_TIMEOUT, a, pool)
    assert [c.cause for c in stale.settle(served=False)] == [FailureCause.REPLICA]


def test_missed_first_tokens_everywhere_are_load(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, b, c = replicas(pool)
    for replica in (a, b):
        attribution.for_request().record(FailureKind.TTFT_TIMEOUT, replica, pool)  # no success: replica
    verdict = attribution.for_request().record(FailureKind.TTFT_TIMEOUT, c, pool)
    assert causes(verdict.charges) == [(c.replica_id, FailureCause.LOAD)], "every replica misses them all"
    clock.advance(61.0)
    verdict = attribution.for_request().record(FailureKind.TTFT_TIMEOUT, a, pool)
    assert causes(verdict.charges) == [(a.replica_id, FailureCause.REPLICA)], "the others' misses are old"


def test_a_few_misses_among_many_served_first_tokens_are_not_load(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, b, c = replicas(pool)
    serving(clock, a, b, c)
    for replica in (a, b, c):
        for _ in range(3):
            attribution.first_token_served(replica)
    poison = attribution.for_request()
    poison.record(FailureKind.TTFT_TIMEOUT, a, pool)
    assert poison.record(FailureKind.TTFT_TIMEOUT, b, pool).quarantine
    later = attribution.for_request()
    later.record(FailureKind.TTFT_TIMEOUT, c, pool)
    assert [ch.cause for ch in later.settle(served=False)] == [FailureCause.REPLICA], (
        "one miss in four is not load"
    )


def test_a_pending_failure_is_the_requests_when_the_replica_served_someone_after_it(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, _, _ = replicas(pool)
    serving(clock, a)
    failures = attribution.for_request()
    failures.record(FailureKind.STATUS_5XX, a, pool)  # its retry was refused, say
    clock.advance(0.5)
    a.last_success_s = clock.now_s()  # another request's whole response, after the failure
    assert causes(failures.settle(served=False)) == [(a.replica_id, FailureCause.REQUEST)]


def test_a_replica_that_breaks_some_streams_is_charged_when_the_request_succeeds_elsewhere(
    clock: FakeClock,
) -> None:
    """A flaky replica keeps serving others, but the request was fine on another one: the replica's."""
    pool, attribution = make_pool(clock)
    a, _, _ = replicas(pool)
    serving(clock, a)
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_BROKEN, a, pool)
    clock.advance(0.5)
    a.last_success_s = clock.now_s()
    assert causes(failures.settle(served=True)) == [(a.replica_id, FailureCause.REPLICA)]


def test_attribution_off_charges_every_failure_to_the_replica_at_once(clock: FakeClock) -> None:
    """`attribution.enabled: false`: the breaker as it was (for comparisons)."""
    settings = parse_settings(
        {"pools": [{"model": "m", "replicas": {"static": URLS}, "attribution": {"enabled": False}}]}
    )
    registry = ReplicaRegistry(settings, GatewayMetrics(), clock, random.Random(0))
    pool = registry.pools["m"]
    attribution = PoolAttribution(pool.settings.attribution, clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    failures = attribution.for_request()
    first = failures.record(FailureKind.STATUS_5XX, a, pool)
    second = failures.record(FailureKind.STATUS_5XX, b, pool)
    assert causes(first.charges) == [(a.replica_id, FailureCause.REPLICA)] and not second.quarantine
    assert causes(failures.record(FailureKind.OVERLOADED, a, pool).charges) == [
        (a.replica_id, FailureCause.LOAD)
    ]


# Silent streams (idle timeouts): load, a sick replica, or a poison request.

QUIET = EngineLoad(waiting=0.0, kv_usage_ratio=0.2)
QUEUEING = EngineLoad(waiting=3.0, kv_usage_ratio=0.5)


def test_an_idle_timeout_is_its_own_kind_and_a_protocol_break_stays_a_broken_stream() -> None:
    assert failure_kind(UpstreamIdleTimeout("silent", replica_id="r")) is FailureKind.STREAM_IDLE
    assert failure_kind(UpstreamProtocolError("reset", replica_id="r")) is FailureKind.STREAM_BROKEN


def test_a_stream_silent_on_two_saturated_engines_is_load_not_a_poison_request(clock: FakeClock) -> None:
    """Overload: both engines queue (a fresh scrape says waiting >= 1) and both keep serving others."""
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    a.engine, b.engine = QUEUEING, QUEUEING
    failures = attribution.for_request()
    assert failures.record(FailureKind.STREAM_IDLE, a, pool).charges == ()
    again = failures.record(FailureKind.STREAM_IDLE, b, pool)
    assert not again.quarantine, "a silence under load repeats everywhere: not the request's"
    assert [c.cause for c in failures.settle(served=True)] == [FailureCause.LOAD, FailureCause.LOAD]
    refused = attribution.for_request()  # its retry refused (budget): load still wins over the request
    refused.record(FailureKind.STREAM_IDLE, a, pool)
    clock.advance(0.5)
    a.last_success_s = clock.now_s()
    assert [c.cause for c in refused.settle(served=False)] == [FailureCause.LOAD]


def test_a_stream_silent_where_one_engine_queues_is_not_a_poison_request(clock: FakeClock) -> None:
    """ "Neither replica shows load": the first replica's queue is enough to doubt the request."""
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    a.engine, b.engine = QUEUEING, QUIET
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_IDLE, a, pool)
    assert not failures.record(FailureKind.STREAM_IDLE, b, pool).quarantine
    assert sorted(c.cause for c in failures.settle(served=True)) == [FailureCause.LOAD, FailureCause.REPLICA]


def test_a_stream_silent_on_two_quiet_replicas_that_serve_others_is_a_poison_request(
    clock: FakeClock,
) -> None:
    """A prompt that silences engines that are not loaded and keep serving everyone else."""
    pool, attribution = make_pool(clock)
    a, b, c = replicas(pool)
    serving(clock, a, b, c)
    a.engine, b.engine, c.engine = QUIET, QUIET, QUIET
    other = attribution.for_request()  # an unrelated stall on the third replica: no evidence about a, b
    other.record(FailureKind.STREAM_IDLE, c, pool)
    other.settle(served=True)
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_IDLE, a, pool)
    verdict = failures.record(FailureKind.STREAM_IDLE, b, pool)
    assert verdict.quarantine, "its own two stalls are not load"
    assert causes(verdict.charges) == [
        (a.replica_id, FailureCause.REQUEST),
        (b.replica_id, FailureCause.REQUEST),
    ]
    assert failures.settle(served=False) == ()


def test_a_stale_engine_sample_is_no_evidence_of_load_for_a_silent_stream(clock: FakeClock) -> None:
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    a.engine = b.engine = EngineLoad(waiting=3.0, stale=True)
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_IDLE, a, pool)
    assert failures.record(FailureKind.STREAM_IDLE, b, pool).quarantine


def test_a_stream_silent_on_replicas_that_silence_other_streams_too_is_not_a_poison_request(
    clock: FakeClock,
) -> None:
    """Without engine metrics (scrape off): the replicas' own recent stalls of other requests are the
    load evidence; the request was then served elsewhere, so the stalls are the replicas'."""
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    for replica in (a, b):
        earlier = attribution.for_request()
        earlier.record(FailureKind.STREAM_IDLE, replica, pool)
        earlier.settle(served=True)
    clock.advance(5.0)
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_IDLE, a, pool)
    assert not failures.record(FailureKind.STREAM_IDLE, b, pool).quarantine
    assert [c.cause for c in failures.settle(served=True)] == [FailureCause.REPLICA, FailureCause.REPLICA]
    clock.advance(61.0)  # the other stalls are old: the same silence on both is the request's again
    serving(clock, a, b)
    later = attribution.for_request()
    later.record(FailureKind.STREAM_IDLE, a, pool)
    assert later.record(FailureKind.STREAM_IDLE, b, pool).quarantine


def test_streams_silent_on_every_replica_are_load(clock: FakeClock) -> None:
    """Every routable replica silenced another request's stream within the window: fleet-wide, so
    load (ejecting one replica would only push its streams onto the others)."""
    pool, attribution = make_pool(clock)
    a, b, c = replicas(pool)
    # no success anywhere: each is charged at once, to the replica while another replica stalled nothing
    first = [attribution.for_request().record(FailureKind.STREAM_IDLE, r, pool) for r in (a, b, c)]
    assert [ch.cause for v in first for ch in v.charges] == [
        FailureCause.REPLICA,
        FailureCause.REPLICA,
        FailureCause.LOAD,  # a and b silenced others' streams, c silenced this one: everywhere
    ]
    verdict = attribution.for_request().record(FailureKind.STREAM_IDLE, a, pool)
    assert causes(verdict.charges) == [(a.replica_id, FailureCause.LOAD)]
    clock.advance(61.0)
    verdict = attribution.for_request().record(FailureKind.STREAM_IDLE, a, pool)
    assert causes(verdict.charges) == [(a.replica_id, FailureCause.REPLICA)], "the others' stalls are old"


def test_a_protocol_break_on_two_quiet_replicas_is_still_a_poison_request(clock: FakeClock) -> None:
    """A broken stream (reset, bad framing) is no symptom of load: the rule for it is unchanged."""
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    a.engine = b.engine = QUEUEING
    failures = attribution.for_request()
    failures.record(FailureKind.STREAM_BROKEN, a, pool)
    assert failures.record(FailureKind.STREAM_BROKEN, b, pool).quarantine


def test_poison_prompts_one_after_another_are_each_quarantined(clock: FakeClock) -> None:
    """A quarantined request's stalls were its own: no evidence of load against the next poison prompt."""
    pool, attribution = make_pool(clock)
    a, b, _ = replicas(pool)
    serving(clock, a, b)
    for _ in range(3):
        failures = attribution.for_request()
        failures.record(FailureKind.STREAM_IDLE, a, pool)
        assert failures.record(FailureKind.STREAM_IDLE, b, pool).quarantine
        clock.advance(1.0)
