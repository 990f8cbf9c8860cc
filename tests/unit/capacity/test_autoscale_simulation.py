"""Closed-loop simulation of the autoscaling signal on the design's worked example (fake clock, 1 s ticks).

A synthetic pool: requests arrive at λ(t) with ±10 % noise per second, wait in a FIFO admission queue
while every ready replica holds B_max = 64 streams, and take TTFT 0.09 s + ō / 68 tok/s (ō = 300 ±10 %,
speeds ±10 %: W ≈ 4.5 s, TPOT p95 ≈ 16 ms under the 16.7 ms SLO). Every 15 s the autoscaler's
decision is applied; new replicas serve after a 90 s cold start, removed ones leave at once.
Load: 20 req/s (the plan's N_base = 2), a 3× step to 60 req/s, then back to 20 (or lower).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import pytest

from capacity.autoscale import AutoscaleDecision, AutoscaleSettings, PoolAutoscaler, PoolCapacity, ScaleAction
from capacity.autoscale_settings import ScaleReason
from capacity.barriers import ceil_count
from capacity.inputs import PlanInputs
from capacity.plan import build_plan
from capacity.results import Plan
from core.clock import FakeClock

B_MAX, STREAM_TOKENS_PER_S, TTFT_S, OUTPUT_TOKENS = 64, 68.0, 0.09, 300
SPIKE_AT_S, FALL_AT_S, END_S = 905, 1505, 2700
PERIOD_S, COOLDOWN_S = 15.0, 300.0


class SyntheticPool:
    """The pool, its admission queue and the autoscaler driving its replica count."""

    def __init__(
        self,
        rate_at: Callable[[int], float],
        capacity: PoolCapacity,
        settings: AutoscaleSettings,
        *,
        initial_replicas: int = 2,
        cold_start_s: float = 90.0,
        seed: int = 7,
        noise: float = 0.1,
    ) -> None:
        self.clock = FakeClock(0.0)
        self.rng = random.Random(seed)
        self.rate_at, self.noise, self.cold_start_s = rate_at, noise, cold_start_s
        self.autoscaler = PoolAutoscaler(
            "13b", capacity, self.clock, settings, initial_replicas=initial_replicas
        )
        self.ready = [f"r{i}" for i in range(initial_replicas)]
        self.starting: list[tuple[float, str]] = []
        self.next_id = initial_replicas
        self.queue: deque[float] = deque()
        self.inflight: list[tuple[float, float, int, float, float]] = []  # finish, wait, tokens, ttft, tpot
        self.carry = 0.0
        self.decisions: list[AutoscaleDecision] = []

    def _jitter(self) -> float:
        return self.rng.uniform(1 - self.noise, 1 + self.noise)

    def _complete(self, t: int) -> None:
        still = []
        for finish, wait, tokens, ttft, tpot in self.inflight:
            if finish <= t:
                e2e = wait + ttft + tokens * tpot
                self.autoscaler.observe_completion(
                    tokens, e2e, ttft_s=wait + ttft, tpot_s=tpot, queue_wait_s=wait
                )
            else:
                still.append((finish, wait, tokens, ttft, tpot))
        self.inflight = still

    def _arrive_and_admit(self, t: int) -> None:
        exact = self.rate_at(t) * self._jitter() + self.carry
        arrivals = int(exact)
        self.carry = exact - arrivals
        self.autoscaler.observe_arrival(arrivals)
        self.queue.extend([float(t)] * arrivals)
        slots = len(self.ready) * B_MAX
        while self.queue and len(self.inflight) < slots:
            wait = t - self.queue.popleft()
            self.autoscaler.observe_queue_wait(wait)
            tokens = round(OUTPUT_TOKENS * self._jitter())
            tpot = self._jitter() / STREAM_TOKENS_PER_S
            ttft = TTFT_S * self._jitter()
            self.inflight.append((t + ttft + tokens * tpot, wait, tokens, ttft, tpot))

    def _scrape(self, before: int) -> None:
        # A tick's arrivals land at once; the time-average batch over the tick is the mean of the
        # counts before and after admission (an engine gauge sampled at a random instant).
        running = (before + len(self.inflight)) / 2
        self.autoscaler.observe_queue_depth(len(self.queue))
        for replica in self.ready:
            self.autoscaler.observe_engine_running(replica, running / len(self.ready))

    def _apply(self, desired: int, t: int) -> None:
        total = len(self.ready) + len(self.starting)
        for _ in range(desired - total):
            self.starting.append((t + self.cold_start_s, f"r{self.next_id}"))
            self.next_id += 1
        for _ in range(total - desired):
            if self.starting:
                self.starting.pop()
            else:
                self.autoscaler.forget_replica(self.ready.pop())

    def run(self, until_s: int) -> list[AutoscaleDecision]:
        for t in range(1, until_s + 1):
            self.clock.set(float(t))
            for item in [s for s in self.starting if s[0] <= t]:
                self.starting.remove(item)
                self.ready.append(item[1])
            self._complete(t)
            before = len(self.inflight)
            self._arrive_and_admit(t)
            self._scrape(before)
            decision = self.autoscaler.poll()
            if decision is not None and decision.evaluated_at_s == t:
                self.decisions.append(decision)
                self._apply(decision.desired_replicas, t)
        return self.decisions


def spike_then(after: float) -> Callable[[int], float]:
    """20 req/s, 3× from SPIKE_AT_S, then `after` req/s from FALL_AT_S."""
    return lambda t: 20.0 if t < SPIKE_AT_S else 60.0 if t < FALL_AT_S else after


def between(decisions: list[AutoscaleDecision], start_s: float, end_s: float) -> list[AutoscaleDecision]:
    return [d for d in decisions if start_s <= d.evaluated_at_s < end_s]


@pytest.fixture
def capacity(worked_plan: Plan, worked_inputs: PlanInputs) -> PoolCapacity:
    return PoolCapacity.from_plan(worked_plan, worked_inputs.slo)


def simulate(capacity: PoolCapacity, after: float = 20.0, seed: int = 7, **settings: object) -> SyntheticPool:
    pool = SyntheticPool(spike_then(after), capacity, AutoscaleSettings(**settings), seed=seed)  # type: ignore[arg-type]
    pool.run(END_S)
    return pool


def plan_answer_at(inputs: PlanInputs, arrival_rate_per_s: float, rho: float) -> int:
    """The planner's barriers for λ, at utilisation ρ: ⌈max(N_thr, N_lat) / ρ⌉."""
    plan = build_plan(
        replace(inputs, workload=replace(inputs.workload, arrival_rate_per_s=arrival_rate_per_s))
    )
    return ceil_count(max(plan.replicas.throughput_gpus, plan.replicas.latency_gpus) / rho)


class TestSteadyLoad:
    @pytest.mark.parametrize("seed", [1, 7, 42])
    def test_holds_the_plans_n_base_without_oscillating(
        self, capacity: PoolCapacity, worked_plan: Plan, seed: int
    ) -> None:
        steady = between(simulate(capacity, seed=seed).decisions, 0, SPIKE_AT_S)
        assert len(steady) == 60  # 15 minutes of noisy (±10 %) observations
        assert {d.desired_replicas for d in steady} == {worked_plan.replicas.n_base} == {2}
        assert {d.action for d in steady} == {ScaleAction.HOLD}
        assert {d.reason for d in steady} == {ScaleReason.LATENCY}  # 1.41 > 1.38, as in the plan

    def test_the_measured_barriers_match_the_plan(self, capacity: PoolCapacity, worked_plan: Plan) -> None:
        last = between(simulate(capacity).decisions, 0, SPIKE_AT_S)[-1].estimate
        assert last.throughput_replicas == pytest.approx(worked_plan.replicas.throughput_gpus, rel=0.05)
        assert last.latency_replicas == pytest.approx(worked_plan.replicas.latency_gpus, rel=0.05)
        assert last.stats.time_in_system_s == pytest.approx(worked_plan.operating.time_in_system_s, rel=0.02)


class TestSpike:
    def test_reaches_the_plans_answer_within_one_period(
        self, capacity: PoolCapacity, worked_plan: Plan, worked_inputs: PlanInputs
    ) -> None:
        decisions = simulate(capacity).decisions
        first = next(d for d in decisions if d.evaluated_at_s >= SPIKE_AT_S + PERIOD_S)
        assert first.evaluated_at_s < SPIKE_AT_S + 2 * PERIOD_S
        assert first.desired_replicas == worked_plan.spike.n_replicas == 6
        assert first.desired_replicas == plan_answer_at(worked_inputs, 60.0, 0.8)
        assert first.reason is ScaleReason.QUEUE  # the queue leads; the 60 s averages still trail

    def test_holds_the_answer_through_cold_start_and_backlog_drain(self, capacity: PoolCapacity) -> None:
        decisions = simulate(capacity).decisions
        during = between(decisions, SPIKE_AT_S + 2 * PERIOD_S, FALL_AT_S)
        assert {d.desired_replicas for d in during} == {6}  # no overshoot while the queue stands
        assert any(d.estimate.queue_draining for d in during)  # the backlog drained on 6's spare capacity
        assert during[-1].estimate.queue_pressure is False


class TestFall:
    def test_steps_down_only_after_the_cooldown(self, capacity: PoolCapacity) -> None:
        decisions = simulate(capacity).decisions
        after = between(decisions, FALL_AT_S, END_S + 1)
        downs = [d for d in after if d.action is ScaleAction.DOWN]
        assert len(downs) == 1
        assert downs[0].evaluated_at_s >= FALL_AT_S + COOLDOWN_S
        assert downs[0].evaluated_at_s <= FALL_AT_S + 60 + COOLDOWN_S + 2 * PERIOD_S  # window + cooldown
        before = [d for d in after if d.evaluated_at_s < downs[0].evaluated_at_s]
        assert {d.desired_replicas for d in before} == {6}
        assert ScaleReason.COOLDOWN in {d.reason for d in before}
        # lands at ⌈D / ρ_down⌉ = ⌈1.41 / 0.6⌉ = 3 and stays there: the hysteresis band, no flapping
        assert {d.desired_replicas for d in after if d.evaluated_at_s >= downs[0].evaluated_at_s} == {3}
        assert not any(d.action is ScaleAction.UP for d in after)

    def test_one_step_at_a_time_each_after_its_own_cooldown(self, capacity: PoolCapacity) -> None:
        decisions = simulate(capacity, scale_down_step_replicas=1).decisions
        downs = [d for d in between(decisions, FALL_AT_S, END_S + 1) if d.action is ScaleAction.DOWN]
        assert [(d.previous_replicas, d.desired_replicas) for d in downs] == [(6, 5), (5, 4), (4, 3)]
        gaps = [b.evaluated_at_s - a.evaluated_at_s for a, b in itertools.pairwise(downs)]
        assert all(gap >= COOLDOWN_S for gap in gaps)

    @pytest.mark.parametrize(("min_replicas", "expected"), [(1, 1), (4, 4)])
    def test_never_below_the_minimum(self, capacity: PoolCapacity, min_replicas: int, expected: int) -> None:
        decisions = simulate(capacity, after=0.5, min_replicas=min_replicas).decisions
        assert min(d.desired_replicas for d in decisions) >= min_replicas
        assert decisions[-1].desired_replicas == expected
        assert decisions[-1].reason is ScaleReason.MINIMUM
