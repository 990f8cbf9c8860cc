"""Token-aware load on a replica (what its slots count) and the cap its learned TPOT model finds."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.latency_settings import LatencyModelSettings
from gateway.config.settings import parse_settings
from gateway.upstream.engine_metrics.sample import EngineSample
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.replica import Replica
from gateway.upstream.replica_cost import ReplicaCost
from gateway.upstream.tpot_limit import WINDOW_GAIN
from router.types import Branch, Decision, EngineLoad

MODEL = "m"


def registry(clock: FakeClock | None = None, **pool: Any) -> tuple[ReplicaRegistry, Replica, GatewayMetrics]:
    settings = parse_settings(
        {"pools": [{"model": MODEL, "replicas": {"static": ["http://10.0.0.1:8000"]}, **pool}]}
    )
    metrics = GatewayMetrics()
    reg = ReplicaRegistry(settings, metrics, clock or FakeClock(0.0), random.Random(1))
    (replica,) = reg.pools[MODEL].replicas.values()
    return reg, replica, metrics


DECISION = Decision(replica_id="x", policy="p", branch=Branch.PREFIX_MATCH)


def test_prefill_tokens_move_to_the_decode_batch_at_the_first_token_and_leave_at_release() -> None:
    reg, replica, metrics = registry()
    a = reg.claim(replica, DECISION, 1200, uncached_tokens=1000)
    b = reg.claim(replica, DECISION, 700, uncached_tokens=500)
    assert (replica.cost.prefill_tokens_inflight, replica.cost.decoding_requests) == (1500, 0)
    view = replica.view(0.0)
    assert (view.prefill_tokens_inflight, view.decoding_requests) == (1500, 0)
    a.first_token()
    a.first_token()  # once only
    assert (replica.cost.prefill_tokens_inflight, replica.cost.decoding_requests) == (500, 1)
    gauge = metrics.prefill_tokens_inflight.labels(replica.replica_id)
    assert gauge._value.get() == 500
    b.release()  # left during its prefill (a failure, a disconnect)
    a.release()
    a.release()
    b.first_token()  # after release: nothing
    assert (replica.cost.prefill_tokens_inflight, replica.cost.decoding_requests) == (0, 0)
    assert replica.inflight_requests == 0 and gauge._value.get() == 0


def test_the_model_learns_from_first_tokens_and_finished_streams() -> None:
    clock = FakeClock(0.0)  # the slots' times are the registry's clock's
    reg, replica, metrics = registry(clock, latency_model={"warm_after": 2})
    for n in range(3):
        slot = reg.claim(replica, DECISION, 100, uncached_tokens=80)
        clock.advance(0.2 + 0.01 * n)
        slot.first_token()
        clock.advance(0.38 + 0.02 * n)
        slot.finished(20)
        slot.release()
    model = replica.cost.model
    assert model is not None and model.ttft.samples == 3 and model.tpot.samples == 3
    assert replica.view(0.0).latency is model.estimate and model.estimate.ttft is not None
    # Only the third sample met a warm model: its error is the exported one.
    assert model.ttft_error.samples == 1 and model.ttft_error.value is not None
    gauge = metrics.latency_model_error_ratio.labels(replica.replica_id, "ttft")
    assert gauge._value.get() == pytest.approx(model.ttft_error.value)


def test_a_continuation_counts_its_first_token_but_teaches_nothing() -> None:
    reg, replica, _ = registry()
    slot = reg.claim(replica, DECISION, 100, uncached_tokens=80)
    slot.first_token(learn=False)
    assert replica.cost.decoding_requests == 1
    assert replica.cost.model is not None and replica.cost.model.ttft.samples == 0
    slot.release()


def test_non_streamed_and_one_token_answers_teach_no_tpot() -> None:
    reg, replica, _ = registry()
    slot = reg.claim(replica, DECISION, 100)
    slot.finished(50)  # never saw a first token (non-streamed)
    slot.first_token()
    slot.finished(1)
    slot.release()
    assert replica.cost.model is not None and replica.cost.model.tpot.samples == 0


def cost_with_law(
    intercept_s: float, per_sequence_s: float, *, configured_cap: int | None = None, **settings: Any
) -> ReplicaCost:
    settings = {"adaptive_cap": True, **settings}
    cost = ReplicaCost(
        LatencyModelSettings(warm_after=8, **settings), tpot_slo_s=0.05, configured_cap=configured_cap
    )
    rng = random.Random(5)
    for _ in range(200):
        running = rng.uniform(1, 100)
        cost.learn_tpot(running, None, intercept_s + per_sequence_s * running)
    return cost


def test_the_learned_cap_is_on_by_default_with_its_set_point_at_four_fifths_of_the_objective() -> None:
    cost = ReplicaCost(LatencyModelSettings(), tpot_slo_s=0.05)
    breach(cost, 0.045, inflight=90)  # within the objective, above its 0.8 set point: 90 × 0.04 / 0.045
    assert cost.learned_cap == 80
    assert ReplicaCost(LatencyModelSettings(), tpot_slo_s=None).learned_cap is None  # no TPOT objective


def test_no_learned_cap_while_the_measured_tpot_holds_the_objective() -> None:
    """The TPOT model's own solved batch (about 133 here) is not a cap: only a broken objective is."""
    cost = cost_with_law(0.010, 0.0003)  # at most 40 ms over the batches seen
    assert cost.learned_cap is None


def breach(cost: ReplicaCost, tpot_s: float, inflight: int) -> None:
    for _ in range(8):
        cost.learn_tpot(running=inflight, engine=None, tpot_s=tpot_s, inflight=inflight)


def test_the_learned_cap_is_bounded_by_the_configured_cap_and_the_floor() -> None:
    capped = ReplicaCost(LatencyModelSettings(adaptive_cap=True), tpot_slo_s=0.05, configured_cap=32)
    breach(capped, 0.06, inflight=100)  # 100 × 0.05 / 0.06 = 83, above the configured 32
    assert capped.learned_cap == 32
    floored = ReplicaCost(LatencyModelSettings(adaptive_cap=True, min_cap_per_replica=6), tpot_slo_s=0.05)
    breach(floored, 1.0, inflight=10)  # 10 × 0.5 = 5, below the floor
    assert floored.learned_cap == 6


def test_no_learned_cap_when_off_flat_or_without_a_tpot_slo() -> None:
    assert cost_with_law(0.010, 0.0005, adaptive_cap=False).learned_cap is None
    assert cost_with_law(0.010, 0.0).learned_cap is None
    off = ReplicaCost(LatencyModelSettings(adaptive_cap=False), tpot_slo_s=0.05)
    breach(off, 1.0, inflight=50)
    assert off.learned_cap is None
    cost = ReplicaCost(LatencyModelSettings(warm_after=1), tpot_slo_s=None)
    cost.learn_tpot(10, None, 0.02)
    assert cost.learned_cap is None
    assert ReplicaCost(LatencyModelSettings(enabled=False)).estimate is None


def test_the_learned_cap_is_what_routing_sees_as_the_replica_cap() -> None:
    _, replica, _ = registry(max_concurrency_per_replica=64)
    assert replica.view(0.0).max_concurrency == 64
    replica.cost.learned_cap = 20
    assert replica.view(0.0).max_concurrency == 20


def test_engine_running_refines_the_batch_when_fresh() -> None:
    cost = ReplicaCost()
    cost.decoding_requests = 3
    assert cost.running(EngineLoad(running=10)) == 10
    assert cost.running(EngineLoad(running=10, stale=True)) == 3
    sample = cost.dispatched(100, EngineLoad(running=10), inflight=5)
    assert (sample.queued_prefill_tokens, sample.running) == (100, 10)
    assert sample.waiting == 2  # 5 in flight, 3 of them decoding
    assert cost.dispatched(0, EngineLoad(waiting=7), inflight=5).waiting == 7


@pytest.mark.parametrize("bad", [{"forgetting_factor": 0.2}, {"warm_after": 0}, {"min_cap_per_replica": 0}])
def test_bad_latency_model_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="latency_model"):
        registry(latency_model=bad)


def test_the_ttft_model_learns_the_own_tokens_apart_from_the_tokens_ahead() -> None:
    """Misses alone (4,000 own tokens), hits alone (100) and hits behind a miss in flight (100 own,
    4,000 ahead) at the engine's law — own tokens cost 0.125 s per 1,000, tokens ahead half that: the
    model predicts all three; one coefficient for all queued tokens could not (not linear in them)."""
    cost = ReplicaCost(LatencyModelSettings(warm_after=4, forgetting_factor=1.0))
    for i in range(90):
        ahead, own = [(0, 4000), (4000, 100), (0, 100)][i % 3]
        cost.prefill_tokens_inflight = ahead
        sample = cost.dispatched(own, None, inflight=0)
        cost.first_token(sample, 0.02 + 0.0625 * ahead / 1000 + 0.125 * own / 1000)
        cost.decoding_requests = 0
    estimate = cost.estimate
    assert estimate is not None
    assert estimate.ttft_s(4000, 0, 0, 4000) == pytest.approx(0.02 + 0.5, rel=1e-3)
    assert estimate.ttft_s(4100, 0, 0, 100) == pytest.approx(0.02 + 0.25 + 0.0125, rel=1e-3)
    assert estimate.ttft_s(100, 0, 0, 100) == pytest.approx(0.02 + 0.0125, rel=1e-3)


def test_the_ttft_model_learns_the_phase_of_the_step_in_flight() -> None:
    """An engine stepping every 50 ms: a request waits out what is left of the step in flight, then
    20 ms. Tokens relayed at step ends mark the step's start, so the time since the last one is the
    phase the model needs: it predicts 60 ms 10 ms into a step and 30 ms 40 ms into it (without the
    input it could only predict their mean)."""
    clock = FakeClock(0.0)
    cost = ReplicaCost(LatencyModelSettings(warm_after=4, forgetting_factor=1.0), clock=clock)
    cost.decoding_requests = 1  # another stream decodes: the engine steps
    for i in range(40):
        cost.token_relayed()  # a step ends
        since_s = 0.005 * (i % 10)
        clock.advance(since_s)
        sample = cost.dispatched(100, None, inflight=1)
        assert sample.since_last_token_s == pytest.approx(since_s)
        cost.first_token(sample, 0.02 + (0.05 - since_s))
        cost.decoding_requests = 1
        clock.advance(0.05 - since_s)
    estimate = cost.estimate
    assert estimate is not None
    assert estimate.ttft_s(100, 1, 0, 100, 0.01) == pytest.approx(0.06, rel=1e-3)
    assert estimate.ttft_s(100, 1, 0, 100, 0.04) == pytest.approx(0.03, rel=1e-3)


def test_a_token_relayed_from_one_replica_does_not_move_another() -> None:
    """Each replica keeps its own last token; before any, or with nothing decoding there, the time
    since it is 0 (neutral: the model's term adds nothing)."""
    urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    settings = parse_settings({"pools": [{"model": MODEL, "replicas": {"static": urls}}]})
    reg = ReplicaRegistry(settings, GatewayMetrics(), FakeClock(0.0), random.Random(1))
    clock = FakeClock(10.0)
    a, b = reg.pools[MODEL].replicas.values()
    for replica in (a, b):
        replica.cost = ReplicaCost(clock=clock)
    slot_a, slot_b = reg.claim(a, DECISION, 100), reg.claim(b, DECISION, 100)
    slot_a.first_token()
    slot_b.first_token()
    assert (a.view(0.0).since_last_token_s, b.view(0.0).since_last_token_s) == (0.0, 0.0)
    a.cost.token_relayed()
    clock.advance(0.03)
    assert a.view(0.0).since_last_token_s == pytest.approx(0.03)
    assert b.view(0.0).since_last_token_s == 0.0 and b.cost.last_token_s is None
    b.cost.token_relayed()
    clock.advance(0.02)
    assert a.view(0.0).since_last_token_s == pytest.approx(0.05)
    assert b.view(0.0).since_last_token_s == pytest.approx(0.02)
    assert a.cost.dispatched(10, None, inflight=1).since_last_token_s == pytest.approx(0.05)
    slot_b.release()  # nothing decodes on b: no step in flight there
    assert b.view(0.0).since_last_token_s == 0.0


def test_a_claim_passes_the_prompt_size_and_its_affinity_tokens_to_the_replica() -> None:
    reg, replica, _ = registry()
    reg.claim(replica, DECISION, 1200, uncached_tokens=250, prompt_tokens=1000, affinity_tokens=750).release()
    assert replica.cost.affinity_share == pytest.approx(0.75)


def engine_sample(running: float, waiting: float = 0.0, token_latency_s: float | None = None) -> EngineSample:
    return EngineSample(running, waiting, None, None, taken_at_s=0.0, token_latency_s=token_latency_s)


def test_an_engine_fed_cap_is_on_the_whole_batch_and_other_senders_come_off_it() -> None:
    _, replica, _ = registry(slo={"tpot_s": 0.05})  # set point 40 ms
    replica.inflight_requests = 30
    assert not replica.engine_sampled(engine_sample(running=100, token_latency_s=0.08))  # gradient 0.5
    cap = replica.cost.learned_cap
    assert cap == math.floor(100 * 0.5**WINDOW_GAIN), "the first cut: from the 100 the engine runs"
    assert replica.cost.foreign_requests == 70, "70 of them are other instances' (or direct clients')"
    assert replica.effective_max_concurrency() == cap - 70, "this instance's share of the engine's cap"
    replica.inflight_requests = 20
    grew = replica.engine_sampled(engine_sample(running=45))  # the others left; no window closed
    assert grew, "its cap grew: admission should look at its waiters"
    assert replica.effective_max_concurrency() == cap - 25
    assert replica.engine_sampled(None), "stale samples: nothing known of other senders, its share grows"
    assert replica.cost.foreign_requests == 0
    assert replica.effective_max_concurrency() == cap
    replica.engine_sampled(engine_sample(running=20 + cap))  # others run all of the cap's room
    assert replica.effective_max_concurrency() == 0
    assert not replica.view(0.0).has_free_slot


def test_without_an_engine_window_the_cap_stays_this_instances_own() -> None:
    _, replica, _ = registry(slo={"tpot_s": 0.05})
    for _ in range(8):
        replica.cost.learn_tpot(running=90, engine=None, tpot_s=0.1, inflight=100)
    replica.inflight_requests = 10
    replica.engine_sampled(engine_sample(running=60))  # 50 foreign, but the cap is not the engine's
    assert replica.cost.learned_cap == 50
    assert replica.effective_max_concurrency() == 50


def test_a_configured_cap_still_bounds_this_instance_under_an_engine_fed_cap() -> None:
    _, replica, _ = registry(slo={"tpot_s": 0.05}, max_concurrency_per_replica=16)
    replica.engine_sampled(engine_sample(running=200, token_latency_s=0.08))
    assert replica.cost.learned_cap == math.floor(200 * 0.5**WINDOW_GAIN), "engine-wide, not clamped at 16"
    replica.engine_sampled(engine_sample(running=0))
    assert replica.effective_max_concurrency() == 16


def test_a_share_of_the_learned_cap_scales_only_a_learned_cap() -> None:
    """The lowest class's share (`admission.lowest_class_reserve`): ⌊learned × share⌋, at least 1; the
    view built with it says the replica is full at that count; a hand-set cap alone is not scaled."""
    _, replica, _ = registry(slo={"tpot_s": 0.05})
    for _ in range(8):
        replica.cost.learn_tpot(running=90, engine=None, tpot_s=0.1, inflight=100)
    assert replica.cost.learned_cap == 50
    assert replica.effective_max_concurrency(0.9) == 45
    replica.inflight_requests = 45
    assert replica.view(0.0).has_free_slot, "the whole cap: 45 of 50"
    assert not replica.view(0.0, 0.9).has_free_slot, "the lowest class's 90 %: full"
    _, hand_set, _ = registry(max_concurrency_per_replica=16)
    assert hand_set.effective_max_concurrency(0.9) == 16


def test_an_instance_sending_a_third_of_the_requests_trims_its_set_point_at_the_replicas_pace() -> None:
    """Each instance hears only of its own finished requests: one with a third of the engine's batch
    trims its set point after a third of the requests one instance alone needs (the replica's pace),
    and its share follows the engine's batch (`own_share`)."""
    _, alone, _ = registry()
    _, third, _ = registry()
    for _ in range(40):  # held at the 40 ms set point, 90 running on the engine
        alone.cost.engine_sampled(0.038, 90.0, own_inflight=90)
        third.cost.engine_sampled(0.038, 90.0, own_inflight=30)
    assert alone.cost.own_share == 1.0
    assert third.cost.own_share == pytest.approx(1 / 3, abs=0.02)
    for _ in range(32):  # each hears of 32 finished requests far inside the objective
        alone.cost.learn_tpot(90.0, None, 0.03, inflight=90)
        third.cost.learn_tpot(90.0, None, 0.03, inflight=30)
    assert alone.learned_cap_set_point_s == pytest.approx(0.04), "alone: 64 of its own before a trim"
    assert third.learned_cap_set_point_s == pytest.approx(0.04 * 1.25**0.5), "a third: 21, then one step"
    third.cost.engine_lost()
    assert third.cost.own_share == 1.0, "no scrape: nothing known of other senders"
