"""Hysteresis rules one by one, and the per-pool facade: poll cadence, decisions and exported gauges."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from capacity.autoscale import METRIC_DESIRED_REPLICAS, PoolAutoscaler
from capacity.autoscale_controller import HysteresisController, ScaleAction
from capacity.autoscale_estimate import Estimate, estimate_replicas
from capacity.autoscale_settings import AutoscaleSettings, PoolCapacity, ScaleReason
from capacity.autoscale_window import WindowStats
from core.clock import FakeClock

CAPACITY = PoolCapacity(b_max=64, decode_tokens_per_s=4_352.0)
EMPTY = WindowStats(
    0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, None, None, None, 0, None, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, None, 0
)
BASE = estimate_replicas(EMPTY, CAPACITY, AutoscaleSettings())


def est(up: int, down: int | None = None, reason: ScaleReason = ScaleReason.LATENCY) -> Estimate:
    return replace(
        BASE, scale_up_replicas=up, scale_down_replicas=up if down is None else down, reason=reason
    )


def controller(initial: int = 2, **kwargs: object) -> HysteresisController:
    return HysteresisController(AutoscaleSettings(**kwargs), initial, started_at_s=0.0)  # type: ignore[arg-type]


class TestHysteresis:
    def test_scale_up_is_immediate(self) -> None:
        c = controller()
        step = c.step(est(6, 8, ScaleReason.QUEUE), now_s=15.0)
        assert (step.replicas, step.previous_replicas, step.action, step.reason) == (
            6,
            2,
            ScaleAction.UP,
            ScaleReason.QUEUE,
        )
        assert c.replicas == 6

    def test_inside_the_band_it_holds(self) -> None:
        c = controller(initial=3)
        step = c.step(est(2, 3), now_s=600.0)  # 3 is within [up 2, down 3]
        assert (step.replicas, step.action, step.reason) == (3, ScaleAction.HOLD, ScaleReason.LATENCY)

    def test_scale_down_waits_for_the_cooldown(self) -> None:
        c = controller(initial=6)
        pending = [c.step(est(2, 3), now_s=t) for t in range(100, 400, 15)]  # 100 .. 385
        assert {p.replicas for p in pending} == {6}
        assert {p.reason for p in pending} == {ScaleReason.COOLDOWN}
        assert pending[-1].scale_down_pending_s == 285.0
        step = c.step(est(2, 3), now_s=400.0)
        assert (step.replicas, step.action) == (3, ScaleAction.DOWN)

    def test_the_low_timer_restarts_when_the_signal_comes_back(self) -> None:
        c = controller(initial=6)
        c.step(est(2, 3), now_s=100.0)
        c.step(est(5, 6), now_s=300.0)  # back in the band: the timer resets
        assert c.step(est(2, 3), now_s=390.0).scale_down_pending_s == 0.0
        assert c.step(est(2, 3), now_s=689.0).replicas == 6
        assert c.step(est(2, 3), now_s=690.0).replicas == 3

    def test_no_scale_down_while_the_window_fills(self) -> None:
        c = controller(initial=6, scale_down_cooldown_s=0.0)
        assert c.step(est(1, 1), now_s=59.0).action is ScaleAction.HOLD
        assert c.step(est(1, 1), now_s=60.0).replicas == 1

    def test_step_mode_moves_one_replica_per_cooldown(self) -> None:
        c = controller(initial=6, scale_down_step_replicas=1)
        c.step(est(2, 3), now_s=100.0)
        assert c.step(est(2, 3), now_s=400.0).replicas == 5
        assert c.step(est(2, 3), now_s=415.0).replicas == 5  # a new cooldown starts here
        assert c.step(est(2, 3), now_s=715.0).replicas == 4

    def test_initial_count_is_clamped(self) -> None:
        assert controller(initial=0).replicas == 1
        assert controller(initial=9, max_replicas=5).replicas == 5


class TestPoolAutoscaler:
    def test_poll_evaluates_once_per_period(self) -> None:
        clock = FakeClock(100.0)
        auto = PoolAutoscaler("llama", CAPACITY, clock, initial_replicas=2)
        assert auto.desired_replicas == 2
        clock.advance(14.0)
        assert auto.poll() is None
        clock.advance(1.0)
        first = auto.poll()
        assert first is not None and first.evaluated_at_s == 115.0
        clock.advance(10.0)
        assert auto.poll() is first
        clock.advance(5.0)
        assert auto.poll() is not first

    def test_default_initial_is_the_minimum(self) -> None:
        auto = PoolAutoscaler("llama", CAPACITY, FakeClock(), AutoscaleSettings(min_replicas=2))
        assert auto.desired_replicas == 2

    def test_observations_reach_the_estimate(self) -> None:
        clock = FakeClock(0.0)
        auto = PoolAutoscaler("llama", CAPACITY, clock)
        for t in range(1, 16):
            clock.set(float(t))
            auto.observe_arrival(60)
            auto.observe_completion(300, 6.0, ttft_s=2.0, tpot_s=0.015, queue_wait_s=1.5)
            auto.observe_queue_depth(10 * t)
            auto.observe_queue_wait(1.5)
            auto.observe_engine_running("r0", 64)
            auto.observe_engine_running("r1", 64)
        d = auto.evaluate()
        s = d.estimate.stats
        assert (s.arrival_rate_per_s, s.time_in_system_s, s.ready_replicas) == (60.0, 4.5, 2)
        assert d.estimate.queue_pressure
        assert (d.desired_replicas, d.action, d.reason) == (6, ScaleAction.UP, ScaleReason.QUEUE)
        auto.forget_replica("r1")
        assert auto.evaluate().estimate.stats.ready_replicas == 1

    def test_traffic_share_scales_the_arrival_rate(self) -> None:
        clock = FakeClock(0.0)
        auto = PoolAutoscaler("llama", CAPACITY, clock)
        auto.set_traffic_share(0.25)
        clock.set(10.0)
        auto.observe_arrival(50)
        d = auto.evaluate()
        assert d.estimate.arrival_rate_per_s == 20.0  # 50 in 10 s here, a quarter of the pool's
        gauges = {
            s.name: s.value for s in d.gauges() if "reason" not in s.labels and "barrier" not in s.labels
        }
        assert gauges["llm_gateway_autoscale_arrival_rate_per_second"] == 20.0
        assert gauges["llm_gateway_autoscale_traffic_share_ratio"] == 0.25
        with pytest.raises(ValueError, match="ratio"):
            auto.set_traffic_share(0.0)

    def test_a_change_of_share_is_averaged_over_each_window(self) -> None:
        """A second gateway joins at t = 60 at a constant pool load of 20 req/s: this instance's arrivals
        halve and its share goes to 1/2. Dividing the window's rate (45 s at 20/s, 15 s at 10/s) by the
        new share would read 35 req/s; by the window's mean share (0.875) it reads the true 20."""
        clock = FakeClock(0.0)
        auto = PoolAutoscaler("llama", CAPACITY, clock)
        for t in range(75):
            if t == 60:
                clock.set(60.0)
                auto.set_traffic_share(0.5)
            clock.set(t + 0.5)
            auto.observe_arrival(20 if t < 60 else 10)
        clock.set(75.0)
        d = auto.evaluate()
        e = d.estimate
        assert (e.stats.window_span_s, e.stats.recent_span_s) == (60.0, 15.0)
        assert e.stats.arrival_rate_per_s == 17.5
        assert (e.traffic_share_ratio, e.recent_traffic_share_ratio) == (0.875, 0.5)
        assert e.arrival_rate_per_s == pytest.approx(20.0)
        gauges = {
            s.name: s.value for s in d.gauges() if "reason" not in s.labels and "barrier" not in s.labels
        }
        assert gauges["llm_gateway_autoscale_traffic_share_ratio"] == 0.5  # the share now: 1/k
        assert gauges["llm_gateway_autoscale_recent_arrival_rate_per_second"] == pytest.approx(20.0)
        clock.set(120.0)  # a window later only the new share is left
        assert auto.evaluate().estimate.traffic_share_ratio == 0.5

    def test_mean_share_is_time_weighted(self) -> None:
        clock = FakeClock(0.0)
        auto = PoolAutoscaler("llama", CAPACITY, clock)
        clock.set(10.0)
        auto.set_traffic_share(0.5)
        auto.set_traffic_share(0.5)  # unchanged: no new step
        clock.set(20.0)
        auto.set_traffic_share(0.25)
        clock.set(30.0)
        assert auto.traffic_share_ratio == 0.25
        assert auto.mean_traffic_share(0.0) == 0.25
        assert auto.mean_traffic_share(10.0) == 0.25
        assert auto.mean_traffic_share(20.0) == pytest.approx(0.375)
        assert auto.mean_traffic_share(30.0) == pytest.approx((10 + 5 + 2.5) / 30)
        clock.set(30.0)
        auto.set_traffic_share(1.0)
        auto.set_traffic_share(0.2)  # twice at the same instant: the last one holds from then on
        clock.set(40.0)
        assert auto.mean_traffic_share(10.0) == pytest.approx(0.2)

    def test_gauges(self) -> None:
        clock = FakeClock(0.0)
        auto = PoolAutoscaler("llama-3.1-8b", CAPACITY, clock, initial_replicas=2)
        clock.advance(15.0)
        d = auto.evaluate()
        samples = d.gauges()
        assert samples[0] == (METRIC_DESIRED_REPLICAS, {"pool": "llama-3.1-8b"}, 2.0)
        by_name = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
        assert len(by_name) == len(samples)  # no duplicate series
        reasons = {s.labels["reason"]: s.value for s in samples if s.name == "llm_gateway_autoscale_reason"}
        assert set(reasons) == {r.value for r in ScaleReason}
        assert sum(reasons.values()) == 1.0 and reasons[d.reason.value] == 1.0
        barriers = {
            s.labels["barrier"] for s in samples if s.name == "llm_gateway_autoscale_barrier_replicas"
        }
        assert barriers == {"throughput", "latency", "queue"}
        assert math.isnan(by_name[("llm_gateway_autoscale_ttft_p95_seconds", (("pool", "llama-3.1-8b"),))])
        assert all(s.name.startswith("llm_gateway_") for s in samples)


def test_decision_is_frozen() -> None:
    auto = PoolAutoscaler("p", CAPACITY, FakeClock())
    d = auto.evaluate()
    with pytest.raises(AttributeError):
        d.desired_replicas = 3  # type: ignore[misc]
