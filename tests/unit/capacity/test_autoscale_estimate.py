"""The estimator on hand-made window stats: parity with the planner, and every binding reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from capacity.autoscale_estimate import estimate_replicas
from capacity.autoscale_settings import AutoscaleSettings, PoolCapacity, ScaleReason
from capacity.autoscale_window import WindowStats
from capacity.errors import InfeasibleError
from capacity.inputs import PlanInputs, Slo, ThroughputPoint, ThroughputTable
from capacity.results import Plan

CAPACITY = PoolCapacity(b_max=64, decode_tokens_per_s=4_352.0, ttft_p95_slo_s=0.5, tpot_p95_slo_s=0.0167)
SETTINGS = AutoscaleSettings()


def stats(**overrides: object) -> WindowStats:
    """The worked example's steady state on 2 ready replicas: λ = 20, ō = 300, W = 4.5, no queue."""
    base = WindowStats(
        now_s=600.0,
        window_span_s=60.0,
        recent_span_s=15.0,
        arrivals=1_200,
        arrival_rate_per_s=20.0,
        recent_arrival_rate_per_s=20.0,
        completions=1_200,
        mean_output_tokens=300.0,
        time_in_system_s=4.5,
        ttft_p95_s=0.1,
        ttft_samples=1_200,
        tpot_p95_s=0.015,
        tpot_samples=1_200,
        ready_replicas=2,
        engine_running_requests=90.0,
        max_replica_running_requests=45.0,
        queue_depth_standing=0.0,
        queue_depth_last=0.0,
        queue_trend_per_s=0.0,
        queue_wait_p95_s=0.0,
        queue_wait_samples=1_200,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


class TestPlannerParity:
    def test_worked_example_gives_the_plans_barriers_and_n_base(
        self, worked_plan: Plan, worked_inputs: PlanInputs
    ) -> None:
        capacity = PoolCapacity.from_plan(worked_plan, worked_inputs.slo)
        w_s = worked_plan.operating.time_in_system_s
        e = estimate_replicas(stats(time_in_system_s=w_s, engine_running_requests=0.0), capacity, SETTINGS)
        assert e.throughput_replicas == pytest.approx(worked_plan.replicas.throughput_gpus)
        assert e.latency_replicas == pytest.approx(worked_plan.replicas.latency_gpus)
        assert e.concurrency_requests == pytest.approx(worked_plan.operating.concurrency_requests)
        assert e.scale_up_replicas == worked_plan.replicas.n_base == 2
        assert e.reason is ScaleReason.LATENCY  # the plan's binding barrier, too
        assert e.scale_down_replicas == 3  # ⌈1.41 / 0.6⌉

    def test_three_times_the_load_gives_the_plans_spike_answer(self, worked_plan: Plan) -> None:
        e = estimate_replicas(
            stats(arrival_rate_per_s=60.0, engine_running_requests=270.0), CAPACITY, SETTINGS
        )
        assert e.scale_up_replicas == worked_plan.spike.n_replicas == 6  # ⌈4.22 / 0.8⌉

    def test_capacity_from_the_table_is_the_planners_operating_point(self, worked_inputs: PlanInputs) -> None:
        capacity = PoolCapacity.from_table(worked_inputs.throughput, worked_inputs.slo, 300.0)
        assert capacity == PoolCapacity(64, 4_352.0, None, 0.0167)

    def test_capacity_from_a_table_no_row_meets(self, worked_inputs: PlanInputs) -> None:
        with pytest.raises(InfeasibleError, match="slo"):
            PoolCapacity.from_table(worked_inputs.throughput, Slo(tpot_max_s=0.001), 300.0)

    def test_min_stream_speed_becomes_a_tpot_bound(self) -> None:
        table = ThroughputTable((ThroughputPoint(16, 105.0, 1_680.0),), ttft_mean_s=0.1)
        capacity = PoolCapacity.from_table(table, Slo(tpot_max_s=0.05, min_stream_tokens_per_s=50.0), 300.0)
        assert capacity.tpot_p95_slo_s == pytest.approx(0.02)


class TestReasons:
    def test_throughput(self) -> None:
        e = estimate_replicas(
            stats(mean_output_tokens=600.0, time_in_system_s=2.0, engine_running_requests=40.0),
            CAPACITY,
            SETTINGS,
        )
        assert e.throughput_replicas == pytest.approx(12_000 / 4_352)
        assert (e.scale_up_replicas, e.reason) == (4, ScaleReason.THROUGHPUT)  # ⌈2.76 / 0.8⌉

    def test_latency_led_by_the_engines_batches(self) -> None:
        e = estimate_replicas(stats(engine_running_requests=200.0), CAPACITY, SETTINGS)
        assert e.concurrency_requests == 200.0  # more than λ·W = 90: the batches lead the averages
        assert e.occupancy_ratio == pytest.approx(200 / 128)
        assert (e.scale_up_replicas, e.reason) == (4, ScaleReason.LATENCY)  # ⌈3.125 / 0.8⌉

    def test_queue_leads_with_the_recent_arrival_rate(self) -> None:
        s = stats(recent_arrival_rate_per_s=60.0, queue_depth_standing=100.0, queue_trend_per_s=30.0)
        e = estimate_replicas(s, CAPACITY, SETTINGS)
        assert e.queue_pressure and not e.queue_draining
        assert e.queue_replicas == pytest.approx(60 * 4.5 / 64)
        assert (e.scale_up_replicas, e.reason) == (6, ScaleReason.QUEUE)

    def test_a_growing_queue_adds_a_replica_even_when_averages_do_not(self) -> None:
        s = stats(ready_replicas=4, queue_depth_standing=10.0, queue_trend_per_s=0.5)
        e = estimate_replicas(s, CAPACITY, SETTINGS)
        assert e.queue_floor_replicas == 5
        assert (e.scale_up_replicas, e.reason) == (5, ScaleReason.QUEUE)

    def test_a_draining_queue_does_not(self) -> None:
        s = stats(ready_replicas=4, queue_depth_standing=10.0, queue_trend_per_s=-3.0)
        e = estimate_replicas(s, CAPACITY, SETTINGS)
        assert e.queue_draining and e.queue_floor_replicas == 0
        assert e.scale_up_replicas == 2

    def test_long_waits_are_queue_pressure_too(self) -> None:
        e = estimate_replicas(stats(queue_wait_p95_s=2.0), CAPACITY, SETTINGS)
        assert e.queue_pressure
        assert (e.scale_up_replicas, e.reason) == (3, ScaleReason.QUEUE)  # ready 2 + 1

    def test_under_queue_pressure_full_batches_are_not_demand(self) -> None:
        s = stats(engine_running_requests=128.0, queue_depth_standing=5.0, queue_trend_per_s=-1.0)
        e = estimate_replicas(s, CAPACITY, SETTINGS)
        assert e.concurrency_requests == pytest.approx(90.0)  # λ·W, not the capped 128

    def test_slo_ttft_safety_net(self) -> None:
        e = estimate_replicas(stats(ready_replicas=3, ttft_p95_s=0.8), CAPACITY, SETTINGS)
        assert (e.slo_ttft_breached, e.scale_up_replicas, e.reason) == (True, 4, ScaleReason.SLO_TTFT)

    def test_slo_tpot_safety_net(self) -> None:
        e = estimate_replicas(stats(ready_replicas=3, tpot_p95_s=0.02), CAPACITY, SETTINGS)
        assert (e.slo_tpot_breached, e.scale_up_replicas, e.reason) == (True, 4, ScaleReason.SLO_TPOT)

    def test_safety_net_needs_enough_samples(self) -> None:
        e = estimate_replicas(stats(ttft_p95_s=0.8, ttft_samples=19), CAPACITY, SETTINGS)
        assert not e.slo_ttft_breached
        assert e.reason is ScaleReason.LATENCY

    def test_minimum(self) -> None:
        idle = stats(arrival_rate_per_s=0.1, recent_arrival_rate_per_s=0.1, engine_running_requests=0.5)
        e = estimate_replicas(idle, CAPACITY, SETTINGS)
        assert (e.scale_up_replicas, e.scale_down_replicas, e.reason) == (1, 1, ScaleReason.MINIMUM)
        e = estimate_replicas(idle, CAPACITY, AutoscaleSettings(min_replicas=3))
        assert (e.scale_up_replicas, e.reason) == (3, ScaleReason.MINIMUM)

    def test_zero_minimum_allows_zero_when_nothing_arrives(self) -> None:
        nothing = stats(
            arrival_rate_per_s=0.0,
            recent_arrival_rate_per_s=0.0,
            engine_running_requests=0.0,
            mean_output_tokens=None,
            time_in_system_s=None,
        )
        e = estimate_replicas(nothing, CAPACITY, AutoscaleSettings(min_replicas=0))
        assert (e.scale_up_replicas, e.reason) == (0, ScaleReason.MINIMUM)

    def test_maximum(self) -> None:
        e = estimate_replicas(stats(arrival_rate_per_s=60.0), CAPACITY, AutoscaleSettings(max_replicas=4))
        assert (e.scale_up_replicas, e.scale_down_replicas, e.reason) == (4, 4, ScaleReason.MAXIMUM)

    def test_no_completions_yet_falls_back_to_the_engines(self) -> None:
        s = stats(mean_output_tokens=None, time_in_system_s=None, engine_running_requests=150.0)
        e = estimate_replicas(s, CAPACITY, SETTINGS)
        assert e.throughput_replicas == 0.0
        assert (e.scale_up_replicas, e.reason) == (3, ScaleReason.LATENCY)  # ⌈150 / 64 / 0.8⌉


class TestTrafficShare:
    def test_an_instance_seeing_half_the_traffic_estimates_for_the_pool(self) -> None:
        half = stats(arrival_rate_per_s=10.0, recent_arrival_rate_per_s=10.0, engine_running_requests=0.0)
        e = estimate_replicas(half, CAPACITY, SETTINGS, traffic_share_ratio=0.5)
        whole = estimate_replicas(stats(engine_running_requests=0.0), CAPACITY, SETTINGS)
        assert e.arrival_rate_per_s == 20.0
        assert (e.throughput_replicas, e.latency_replicas) == (
            whole.throughput_replicas,
            whole.latency_replicas,
        )
        assert e.scale_up_replicas == whole.scale_up_replicas == 2

    def test_the_queue_lead_is_scaled_too(self) -> None:
        s = stats(
            arrival_rate_per_s=10.0,
            recent_arrival_rate_per_s=30.0,
            queue_depth_standing=50.0,
            queue_trend_per_s=-1.0,
        )
        e = estimate_replicas(s, CAPACITY, SETTINGS, traffic_share_ratio=0.5)
        assert e.queue_replicas == pytest.approx(60 * 4.5 / 64)
        assert (e.scale_up_replicas, e.reason) == (6, ScaleReason.QUEUE)

    def test_the_recent_window_has_its_own_share(self) -> None:
        s = stats(
            arrival_rate_per_s=10.0,
            recent_arrival_rate_per_s=15.0,
            queue_depth_standing=50.0,
            queue_trend_per_s=-1.0,
        )
        e = estimate_replicas(s, CAPACITY, SETTINGS, traffic_share_ratio=0.5, recent_traffic_share_ratio=0.25)
        assert (e.arrival_rate_per_s, e.recent_traffic_share_ratio) == (20.0, 0.25)
        assert e.queue_replicas == pytest.approx(60 * 4.5 / 64)  # λ' = 15 / 0.25

    @pytest.mark.parametrize("ratio", [0.0, 1.5])
    def test_share_must_be_a_fraction(self, ratio: float) -> None:
        with pytest.raises(ValueError, match="traffic_share_ratio"):
            estimate_replicas(stats(), CAPACITY, SETTINGS, traffic_share_ratio=ratio)
        with pytest.raises(ValueError, match="recent_traffic_share_ratio"):
            estimate_replicas(stats(), CAPACITY, SETTINGS, recent_traffic_share_ratio=ratio)


class TestValidation:
    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"scale_down_utilisation_ratio": 0.8}, "scale_down_utilisation_ratio"),
            ({"scale_up_utilisation_ratio": 1.2}, "scale_up_utilisation_ratio"),
            ({"evaluation_period_s": 120.0}, "evaluation_period_s"),
            ({"min_replicas": -1}, "min_replicas"),
            ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
            ({"scale_down_step_replicas": 0}, "scale_down_step_replicas"),
            ({"scale_down_cooldown_s": -1.0}, "scale_down_cooldown_s"),
            ({"queue_depth_threshold": 0}, "queue_depth_threshold"),
        ],
    )
    def test_settings(self, kwargs: dict[str, float], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            AutoscaleSettings(**kwargs)  # type: ignore[arg-type]

    def test_capacity(self) -> None:
        with pytest.raises(ValueError, match="b_max"):
            PoolCapacity(0, 4_352.0)
        with pytest.raises(ValueError, match="decode_tokens_per_s"):
            PoolCapacity(64, 0.0)
        with pytest.raises(ValueError, match="ttft_p95_slo_s"):
            PoolCapacity(64, 4_352.0, ttft_p95_slo_s=-1.0)

    def test_defaults(self) -> None:
        s = AutoscaleSettings()
        assert (s.window_s, s.evaluation_period_s, s.scale_down_cooldown_s) == (60.0, 15.0, 300.0)
        assert (s.scale_up_utilisation_ratio, s.scale_down_utilisation_ratio) == (0.8, 0.6)
        assert (s.min_replicas, s.max_replicas, s.scale_down_step_replicas) == (1, None, None)
        assert (s.queue_depth_threshold, s.queue_wait_threshold_s) == (1, 1.0)
        assert s.clamp(0) == 1 and AutoscaleSettings(max_replicas=5).clamp(9) == 5
