"""The pure formulas one by one: values, edge cases and the guards against nonsense arguments."""

from __future__ import annotations

import math

import pytest

from capacity import barriers, cost, memory, queueing, spike
from capacity.barriers import Barrier
from capacity.batch import SloTerm, e2e_estimate_s, required_stream_tokens_per_s, select_b_max
from capacity.inputs import Slo, ThroughputPoint, ThroughputTable

TABLE = ThroughputTable(
    points=(
        ThroughputPoint(16, 105.0, 1_680.0, ttft_p95_s=0.2),
        ThroughputPoint(64, 68.0, 4_352.0, ttft_p95_s=0.5),
        ThroughputPoint(128, 44.0, 5_632.0, ttft_p95_s=1.5),
    ),
    ttft_mean_s=0.09,
)


class TestMemory:
    def test_fp8_kv_halves_bytes_per_token(self) -> None:
        assert memory.kv_bytes_per_token(40, 8, 128, 1) == 81_920

    def test_budget_and_tokens(self) -> None:
        assert memory.kv_budget_bytes(80e9, 26e9, 10e9) == 44e9
        assert memory.kv_capacity_tokens(44e9, 163_840) == 268_554
        assert memory.kv_capacity_tokens(-1e9, 163_840) == 0

    def test_resident_requests(self) -> None:
        assert memory.kv_resident_requests(268_554, 800) == pytest.approx(335.69, abs=0.01)

    def test_roofline_is_one_over_step_time(self) -> None:
        # (26e9 + 64 * 800 * 163840) / 3.35e12 s per step
        step_s = (26e9 + 64 * 800 * 163_840) / 3.35e12
        got = memory.decode_roofline_stream_tokens_per_s(26e9, 163_840, 64, 800, 3.35e12)
        assert got == pytest.approx(1 / step_s)

    @pytest.mark.parametrize("args", [(0, 8, 128, 2), (40, 8, 128, 0)])
    def test_rejects_non_positive_dimensions(self, args: tuple[int, int, int, int]) -> None:
        with pytest.raises(ValueError):
            memory.kv_bytes_per_token(*args)


class TestBatch:
    def test_tpot_and_min_speed_combine_to_the_stricter(self) -> None:
        assert required_stream_tokens_per_s(Slo(tpot_max_s=0.02, min_stream_tokens_per_s=70)) == 70
        assert required_stream_tokens_per_s(Slo(tpot_max_s=0.01)) == pytest.approx(100)
        assert required_stream_tokens_per_s(Slo(e2e_p95_s=10)) is None

    def test_min_stream_speed_slo(self) -> None:
        choice = select_b_max(TABLE, Slo(min_stream_tokens_per_s=100), 300)
        assert choice is not None
        assert choice.point.batch == 16
        assert choice.limited_by is SloTerm.STREAM_SPEED

    def test_e2e_slo_uses_ttft_plus_decode_time(self) -> None:
        # batch 64: 0.5 + 300/68 = 4.91 s; batch 128: 1.5 + 300/44 = 8.32 s
        assert e2e_estimate_s(0.5, 300, 68) == pytest.approx(4.912, abs=0.001)
        choice = select_b_max(TABLE, Slo(e2e_p95_s=5.0), 300)
        assert choice is not None
        assert (choice.point.batch, choice.limited_by) == (64, SloTerm.E2E)

    def test_ttft_slo_uses_measured_row_p95(self) -> None:
        choice = select_b_max(TABLE, Slo(ttft_p95_s=1.0), 300)
        assert choice is not None
        assert (choice.point.batch, choice.limited_by) == (64, SloTerm.TTFT)

    def test_ttft_slo_without_measured_ttft_is_an_error(self) -> None:
        table = ThroughputTable(points=(ThroughputPoint(16, 105.0, 1_680.0),), ttft_mean_s=0.1)
        with pytest.raises(ValueError, match="ttft_p95_s"):
            select_b_max(table, Slo(ttft_p95_s=1.0), 300)

    def test_largest_row_meeting_slo_has_no_limit(self) -> None:
        choice = select_b_max(TABLE, Slo(min_stream_tokens_per_s=10), 300)
        assert choice is not None
        assert (choice.point.batch, choice.limited_by) == (128, None)

    def test_no_row_meets_slo(self) -> None:
        assert select_b_max(TABLE, Slo(min_stream_tokens_per_s=200), 300) is None


class TestBarriers:
    def test_littles_law(self) -> None:
        assert barriers.time_in_system_s(0.1, 300, 60) == pytest.approx(5.1)
        assert barriers.littles_law_requests(20, 5.1) == pytest.approx(102)

    def test_each_barrier(self) -> None:
        assert barriers.throughput_gpus(20, 300, 4_352) == pytest.approx(1.3787, abs=1e-4)
        assert barriers.latency_gpus(90, 64) == pytest.approx(1.40625)
        assert barriers.memory_gpus(90, 800, 163_840, 44e9) == pytest.approx(0.2681, abs=1e-4)

    def test_memory_binds_for_long_contexts(self) -> None:
        counts = barriers.barrier_counts(1.2, 1.5, 3.4)
        assert counts.binding is Barrier.MEMORY
        assert (counts.n_throughput, counts.n_latency, counts.n_memory, counts.n_base) == (2, 2, 4, 4)

    def test_n_base_is_at_least_one(self) -> None:
        assert barriers.barrier_counts(0.0, 0.0, 0.0).n_base == 1

    def test_headroom_rounds_up_but_ignores_float_noise(self) -> None:
        assert barriers.replicas_with_headroom(2, 0.5) == 3
        assert barriers.replicas_with_headroom(3, 0.1) == 4  # 3.3 -> 4
        assert barriers.replicas_with_headroom(10, 0.1) == 11  # 11.000000000000002 -> 11
        assert barriers.replicas_with_headroom(1, 0.0, min_replicas=2) == 2

    def test_rejects_nonsense(self) -> None:
        with pytest.raises(ValueError):
            barriers.replicas_with_headroom(2, -0.1)
        with pytest.raises(ValueError):
            barriers.latency_gpus(90, 0)
        with pytest.raises(ValueError):
            barriers.throughput_gpus(20, 300, 0)


class TestQueueing:
    def test_utilisation(self) -> None:
        assert queueing.utilisation_ratio(20, 300, 2, 4_352) == pytest.approx(0.6893, abs=1e-4)
        assert queueing.utilisation_ratio(20, 300, 0, 4_352) == math.inf

    def test_mm1_is_unstable_at_or_above_one(self) -> None:
        assert queueing.mm1_time_multiplier_ratio(0.0) == 1.0
        assert queueing.mm1_time_multiplier_ratio(1.0) == math.inf

    @pytest.mark.parametrize("rho", [0.1, 0.5, 0.7, 0.9, 0.99])
    def test_mmc_with_one_server_is_mm1(self, rho: float) -> None:
        assert queueing.erlang_c_probability(1, rho) == pytest.approx(rho)
        assert queueing.mmc_time_multiplier_ratio(1, rho) == pytest.approx(1 / (1 - rho))

    def test_erlang_c_known_value(self) -> None:
        # c = 2, a = 1 (rho = 0.5): C = (a^2/2! * 1/(1-rho)) / (1 + a + a^2/2! * 1/(1-rho)) = 1/3
        assert queueing.erlang_c_probability(2, 0.5) == pytest.approx(1 / 3)
        assert queueing.mmc_time_multiplier_ratio(2, 0.5) == pytest.approx(1 + (1 / 3) / (2 * 0.5))

    def test_pooling_runs_hotter_but_the_knee_remains(self) -> None:
        at_0_9 = [queueing.mmc_time_multiplier_ratio(c, 0.9) for c in (1, 2, 4, 16)]
        assert at_0_9 == sorted(at_0_9, reverse=True)
        assert queueing.mmc_time_multiplier_ratio(16, 0.99) > 5
        assert queueing.mmc_time_multiplier_ratio(3, 1.0) == math.inf
        assert queueing.erlang_c_probability(3, 1.2) == 1.0

    def test_erlang_c_is_stable_for_many_servers(self) -> None:
        probability = queueing.erlang_c_probability(1_000, 0.95)
        assert 0 < probability < 1


class TestSpikeAndCost:
    def test_no_backlog_when_capacity_suffices(self) -> None:
        assert spike.cold_start_backlog_tokens(10_000, 13_056, 90) == 0
        assert spike.backlog_drain_s(0, 13_056, 10_000) == 0

    def test_drain_without_spare_capacity_is_infinite(self) -> None:
        assert spike.backlog_drain_s(1_000, 10_000, 10_000) == math.inf

    def test_replicas_for_load(self) -> None:
        assert spike.replicas_for_load(18_000, 4_352, 0.8) == 6
        assert spike.replicas_for_load(0, 4_352, 0.8) == 1
        with pytest.raises(ValueError):
            spike.replicas_for_load(18_000, 4_352, 1.5)

    def test_cost(self) -> None:
        assert cost.usd_per_million_tokens(3.6, 1_000) == pytest.approx(1.0)
        assert cost.useful_load_usd_per_million_tokens(0.16, 0.5) == pytest.approx(0.32)
        with pytest.raises(ValueError):
            cost.usd_per_million_tokens(2.5, 0)
        with pytest.raises(ValueError):
            cost.useful_load_usd_per_million_tokens(0.16, 0)
