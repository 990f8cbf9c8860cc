"""The sliding windows by hand: λ, ō, W, p95s, engine batches and the queue, at exact times."""

from __future__ import annotations

import pytest

from capacity.autoscale_window import AutoscaleWindow
from capacity.window_series import least_squares_slope, percentile
from core.clock import FakeClock


def window(start_s: float = 0.0, **kwargs: float) -> tuple[FakeClock, AutoscaleWindow]:
    clock = FakeClock(start_s)
    options = {"window_s": 10.0, "recent_s": 5.0, **kwargs}
    return clock, AutoscaleWindow(clock, **options)  # type: ignore[arg-type]


class TestHelpers:
    def test_nearest_rank_percentile(self) -> None:
        assert percentile([], 0.95) is None
        assert percentile([5.0], 0.95) == 5.0
        assert percentile([float(v) for v in range(20, 0, -1)], 0.95) == 19.0  # ⌈0.95 · 20⌉ = 19th
        assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
        assert percentile([float(v) for v in range(1, 11)], 0.95) == 10.0  # ⌈9.5⌉ = 10th

    def test_least_squares_slope(self) -> None:
        assert least_squares_slope([]) == 0.0
        assert least_squares_slope([(1.0, 5.0)]) == 0.0
        assert least_squares_slope([(1.0, 5.0), (2.0, 7.0), (3.0, 9.0)]) == pytest.approx(2.0)
        assert least_squares_slope([(1.0, 4.0), (1.0, 8.0)]) == 0.0  # no spread in time


class TestArrivals:
    def test_rate_over_the_window_and_the_recent_window(self) -> None:
        clock, w = window()
        for t in range(10):  # 3 arrivals at t = 0, 1, ..., 9
            clock.set(float(t))
            w.observe_arrival(3)
        clock.set(10.0)
        s = w.stats()
        assert (s.arrivals, s.window_span_s, s.arrival_rate_per_s) == (30, 10.0, 3.0)
        assert (s.recent_span_s, s.recent_arrival_rate_per_s) == (5.0, 3.0)  # 15 in [5, 10)

    def test_old_arrivals_slide_out(self) -> None:
        clock, w = window()
        for t in range(10):
            clock.set(float(t))
            w.observe_arrival(3)
        clock.set(15.0)
        s = w.stats()
        assert s.arrival_rate_per_s == 1.5  # [5, 15]: 15 arrivals over 10 s
        assert s.recent_arrival_rate_per_s == 0.0  # [10, 15]: none

    def test_span_is_exact_with_partial_buckets(self) -> None:
        clock, w = window()
        for t in (0.5, 3.2, 10.7):
            clock.set(t)
            w.observe_arrival()
        s = w.stats()  # now 10.7: buckets starting at ≥ 0.7, i.e. [1, 10.7]; 0.5 is out
        assert s.window_span_s == pytest.approx(9.7)
        assert s.arrival_rate_per_s == pytest.approx(2 / 9.7)

    def test_span_never_exceeds_the_time_since_start(self) -> None:
        clock, w = window(start_s=100.0)
        clock.set(102.5)
        w.observe_arrival(5)
        clock.set(104.0)
        s = w.stats()
        assert s.window_span_s == 4.0
        assert s.arrival_rate_per_s == 1.25

    def test_nothing_observed_yet(self) -> None:
        _, w = window()
        s = w.stats()
        assert (s.arrival_rate_per_s, s.completions, s.mean_output_tokens, s.time_in_system_s) == (
            0.0,
            0,
            None,
            None,
        )
        assert (s.ready_replicas, s.queue_depth_standing, s.queue_wait_p95_s) == (0, 0.0, None)


class TestCompletions:
    def test_mean_output_tokens_and_time_in_the_engines(self) -> None:
        clock, w = window()
        clock.set(1.0)
        w.observe_completion(100, 2.0)
        w.observe_completion(300, 5.0, queue_wait_s=1.0)
        w.observe_completion(200, 3.0, queue_wait_s=0.5)
        clock.set(2.0)
        s = w.stats()
        assert s.completions == 3
        assert s.mean_output_tokens == 200.0
        assert s.time_in_system_s == pytest.approx((2.0 + 4.0 + 2.5) / 3)  # e2e minus queue wait

    def test_ttft_p95_is_net_of_queue_wait(self) -> None:
        clock, w = window()
        clock.set(1.0)
        for i in range(1, 21):
            w.observe_completion(10, 1.0, ttft_s=1.0 + i / 100, tpot_s=0.01, queue_wait_s=1.0)
        s = w.stats()
        assert s.ttft_samples == 20
        assert s.ttft_p95_s == pytest.approx(0.19)
        assert s.tpot_p95_s == 0.01

    def test_tpot_is_derived_when_not_given(self) -> None:
        clock, w = window()
        clock.set(1.0)
        w.observe_completion(101, 2.1, ttft_s=0.1)  # (2.1 - 0.1) / 100
        w.observe_completion(1, 0.5, ttft_s=0.5)  # one token: no TPOT
        s = w.stats()
        assert s.tpot_samples == 1
        assert s.tpot_p95_s == pytest.approx(0.02)

    def test_completions_slide_out(self) -> None:
        clock, w = window()
        clock.set(1.0)
        w.observe_completion(100, 2.0, ttft_s=0.1)
        clock.set(12.0)
        s = w.stats()
        assert (s.completions, s.mean_output_tokens, s.ttft_samples) == (0, None, 0)

    def test_latency_samples_restart_when_the_ready_set_changes(self) -> None:
        clock, w = window(replica_stale_s=100.0)
        clock.set(1.0)
        w.observe_engine_running("a", 10)
        w.observe_completion(10, 1.0, ttft_s=0.9)
        clock.set(2.0)
        w.observe_engine_running("b", 0)  # a new replica: judge the SLO on what happens from now on
        assert w.stats().ttft_samples == 0
        w.observe_completion(10, 1.0, ttft_s=0.2)
        assert w.stats().ttft_p95_s == 0.2

    def test_negative_inputs_are_refused(self) -> None:
        _, w = window()
        with pytest.raises(ValueError, match="must be >= 0"):
            w.observe_completion(-1, 1.0)
        with pytest.raises(ValueError, match="must be >= 0"):
            w.observe_arrival(-1)
        with pytest.raises(ValueError, match="must be >= 0"):
            w.observe_queue_depth(-1)


class TestEngines:
    def test_running_is_summed_over_ready_replicas(self) -> None:
        clock, w = window()
        clock.set(6.0)
        w.observe_engine_running("a", 10)
        w.observe_engine_running("b", 30)
        clock.set(7.0)
        w.observe_engine_running("a", 20)
        s = w.stats()
        assert s.ready_replicas == 2
        assert s.engine_running_requests == 45.0  # mean(10, 20) + 30
        assert s.max_replica_running_requests == 30.0

    def test_latest_sample_stands_in_when_none_is_recent(self) -> None:
        clock, w = window(replica_stale_s=30.0)
        clock.set(1.0)
        w.observe_engine_running("a", 12)
        clock.set(9.0)  # outside the 5 s recent window, still fresh
        assert w.stats().engine_running_requests == 12.0

    def test_stale_and_forgotten_replicas_are_not_ready(self) -> None:
        clock, w = window(replica_stale_s=3.0)
        clock.set(1.0)
        w.observe_engine_running("a", 5)
        w.observe_engine_running("b", 7)
        clock.set(3.0)
        w.observe_engine_running("b", 7)
        clock.set(4.5)
        assert w.stats().ready_replicas == 1  # a: last sample 3.5 s ago
        w.forget_replica("b")
        assert w.stats().ready_replicas == 0


class TestQueue:
    def test_standing_depth_trend_and_last(self) -> None:
        clock, w = window()
        for t, depth in ((1.0, 5), (2.0, 7), (3.0, 9)):
            clock.set(t)
            w.observe_queue_depth(depth)
        s = w.stats()
        assert (s.queue_depth_standing, s.queue_depth_last) == (5.0, 9.0)
        assert s.queue_trend_per_s == pytest.approx(2.0)

    def test_an_empty_sample_means_no_standing_queue(self) -> None:
        clock, w = window()
        for t, depth in ((1.0, 50), (2.0, 0), (3.0, 40)):
            clock.set(t)
            w.observe_queue_depth(depth)
        assert w.stats().queue_depth_standing == 0.0

    def test_only_the_recent_window_counts(self) -> None:
        clock, w = window()
        clock.set(1.0)
        w.observe_queue_depth(0)
        w.observe_queue_wait(9.0)
        clock.set(7.0)
        w.observe_queue_depth(4)
        clock.set(8.0)
        s = w.stats()  # recent window [3, 8]
        assert s.queue_depth_standing == 4.0
        assert (s.queue_wait_p95_s, s.queue_wait_samples) == (None, 0)

    def test_wait_p95(self) -> None:
        clock, w = window()
        clock.set(1.0)
        for wait in range(1, 21):
            w.observe_queue_wait(wait / 10)
        s = w.stats()
        assert s.queue_wait_p95_s == pytest.approx(1.9)
        assert s.queue_wait_samples == 20


def test_recent_window_must_fit_in_the_window() -> None:
    with pytest.raises(ValueError, match="recent_s"):
        AutoscaleWindow(FakeClock(), window_s=10.0, recent_s=20.0)
