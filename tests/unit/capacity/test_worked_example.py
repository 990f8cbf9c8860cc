"""Acceptance (issue 8): the design's worked example reproduces the seed's figures, one test each."""

from __future__ import annotations

import dataclasses

import pytest

from capacity.barriers import Barrier
from capacity.batch import SloTerm
from capacity.inputs import PlanInputs, ThroughputPoint
from capacity.plan import build_plan
from capacity.queueing import mm1_time_multiplier_ratio
from capacity.results import Plan


def test_kv_bytes_per_token_is_163840(worked_plan: Plan) -> None:
    assert worked_plan.memory.kv_bytes_per_token == 163_840


def test_kv_budget_is_44_gb_and_about_268000_tokens(worked_plan: Plan) -> None:
    assert worked_plan.memory.weights_bytes == 26e9
    assert worked_plan.memory.kv_budget_bytes == 44e9
    assert worked_plan.memory.kv_capacity_tokens == 268_554  # the design's "≈268,000"
    assert worked_plan.memory.kv_capacity_tokens == pytest.approx(268_000, rel=0.005)


def test_b_max_is_64_at_68_tokens_per_s_limited_by_tpot(worked_plan: Plan) -> None:
    op = worked_plan.operating
    assert op.b_max == 64
    assert op.stream_tokens_per_s == 68
    assert op.decode_tokens_per_s == 4_352
    assert op.limited_by is SloTerm.TPOT


def test_w_is_about_4_5_s(worked_plan: Plan) -> None:
    assert worked_plan.operating.time_in_system_s == pytest.approx(4.5, abs=0.01)


def test_l_is_90(worked_plan: Plan) -> None:
    assert worked_plan.operating.concurrency_requests == pytest.approx(90, abs=0.1)


def test_barriers_are_2_2_1_and_n_base_is_2(worked_plan: Plan) -> None:
    reps = worked_plan.replicas
    assert (reps.n_throughput, reps.n_latency, reps.n_memory) == (2, 2, 1)
    assert reps.n_base == 2
    assert reps.binding is Barrier.LATENCY  # 90/64 ≈ 1.41 beats 6000/4352 ≈ 1.38


def test_n_is_3_with_headroom_0_5(worked_plan: Plan) -> None:
    assert worked_plan.replicas.headroom_ratio == 0.5
    assert worked_plan.replicas.n_replicas == 3


def test_utilisation_is_0_69_at_2_replicas(worked_plan: Plan) -> None:
    util = worked_plan.utilisation
    assert util.at_base_ratio == pytest.approx(0.69, abs=0.005)
    assert util.one_lost_ratio == pytest.approx(0.69, abs=0.005)  # N = 3 minus one replica
    assert util.at_n_ratio == pytest.approx(0.46, abs=0.005)


def test_spike_backlog_is_about_445500_tokens_and_1485_requests(worked_plan: Plan) -> None:
    spike = worked_plan.spike
    assert (spike.factor, spike.cold_start_s) == (3, 90)
    assert spike.backlog_tokens == pytest.approx(444_960)  # with the table's T_dec = 4,352
    assert spike.backlog_tokens == pytest.approx(445_500, rel=0.002)
    assert spike.backlog_requests == pytest.approx(1_485, rel=0.002)


def test_spike_backlog_is_exactly_the_seed_figure_with_t_dec_4350(worked_inputs: PlanInputs) -> None:
    """The design's 445,500 / 1,485 come from T_dec rounded to 4,350 tok/s (DESIGN.md §5)."""
    rows = tuple(
        dataclasses.replace(p, aggregate_tokens_per_s=4_350) if p.batch == 64 else p
        for p in worked_inputs.throughput.points
    )
    table = dataclasses.replace(worked_inputs.throughput, points=rows)
    spike = build_plan(dataclasses.replace(worked_inputs, throughput=table)).spike
    assert spike.backlog_tokens == pytest.approx(445_500)
    assert spike.backlog_requests == pytest.approx(1_485)
    assert spike.n_replicas == 6


def test_spike_needs_6_replicas_under_0_8(worked_plan: Plan) -> None:
    assert worked_plan.spike.target_utilisation_ratio == 0.8
    assert worked_plan.spike.n_replicas == 6


def test_cost_per_million_tokens_is_0_16_0_41_0_53(worked_plan: Plan) -> None:
    cost = worked_plan.cost
    assert round(cost.operating_usd_per_million_tokens, 2) == 0.16
    assert cost.compare_batch == 16
    assert round(cost.compare_usd_per_million_tokens, 2) == 0.41
    assert round(cost.useful_load_usd_per_million_tokens, 2) == 0.53


@pytest.mark.parametrize(("utilisation", "multiplier"), [(0.7, 3.3), (0.9, 10.0)])
def test_mm1_multiplier_at_0_7_and_0_9(utilisation: float, multiplier: float) -> None:
    assert mm1_time_multiplier_ratio(utilisation) == pytest.approx(multiplier, abs=0.05)


def test_worked_example_has_no_warnings(worked_plan: Plan) -> None:
    assert worked_plan.notes == ()


def test_b_max_does_not_interpolate_between_rows(worked_inputs: PlanInputs) -> None:
    """A row at batch 96 meeting the SLO would raise B_max; the gap 64..128 alone does not."""
    rows = (*worked_inputs.throughput.points, ThroughputPoint(96, 60.0, 5_760.0))
    table = dataclasses.replace(worked_inputs.throughput, points=rows)
    plan = build_plan(dataclasses.replace(worked_inputs, throughput=table))
    assert plan.operating.b_max == 96


def test_notes_warn_about_the_table_edge_and_a_context_mismatch(worked_inputs: PlanInputs) -> None:
    slo = dataclasses.replace(worked_inputs.slo, tpot_max_s=0.05)  # every row meets 20 tok/s
    workload = dataclasses.replace(worked_inputs.workload, mean_input_tokens=3_700)  # ctx 4,000 vs 800
    plan = build_plan(dataclasses.replace(worked_inputs, slo=slo, workload=workload))
    assert plan.operating.b_max == 128
    assert plan.operating.limited_by is None
    assert any("largest measured batch" in note for note in plan.notes)
    assert any("measured at ctx 800" in note for note in plan.notes)
