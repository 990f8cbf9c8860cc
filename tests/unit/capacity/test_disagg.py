"""The disaggregated plan against hand-computed figures (capacity/examples/disaggregated.yaml).

Inputs: 13B FP16 (kv_tok = 2·40·8·128·2 = 163,840 B, 26 GB of weights), H100 80 GB at 3,350 GB/s
(M_KV = 44 GB = 268,554 KV tokens), λ = 2/s, ī = 8,000, ō = 256, R_p = 16,000 tok/s, chunk 8,192,
link 50 GB/s, TTFT p95 SLO 1.5 s, TPOT ≤ 16.7 ms; throughput rows 105 / 68 / 44 tok/s at batches
16 / 64 / 128, measured at context 800.

Decode step: t_w = 26e9 / 3.35e12 = 7.7612 ms; t_kv = Σ x (y − t_w) / Σ x² with x = B · 800 and
y = 1 / v: 1,910.66 / 13,271,040,000 = 143.97 ns per context token. At c̄ = 8,000 + 128 = 8,128 one
stream costs 1.1702 ms per step, so B_max = ⌊(16.7 − 7.7612) / 1.1702⌋ = 7 (7.64): step 15.953 ms,
v = 62.686 tok/s, T_dec = 438.80 tok/s. N_thr = N_lat = 512 / 438.80 = 1.1668; T_x = 8,000 · 163,840 /
50e9 = 26.214 ms, W_d = 0.026214 + 256 / 62.686 = 4.1101 s, N_mem = 2 · 4.1101 · 8,256 · 163,840 / 44e9
= 0.2527 → ⌈1.1668⌉ = 2 decode GPUs, binding throughput (the queue model's TPOT p95 at 2 meets 16.7 ms).
n_kv = ⌊268,554 / 8,256⌋ = 32.

Prefill: S_p = t_w + 8,000 / 16,000 = 0.50776 s; one GPU is at ρ = 1.0155 (unstable), so 2 keep up.
At c = 2, ρ = 0.50776: Erlang C = 2ρ² / (1 + ρ) = 0.34199; r = ρ / (2 − ρ) = 0.34026, q = r² = 0.11578;
W95: 0.05 / C = 0.14620 > q, so W95 = S_p · (1 − (0.14620 − q) / (1 − q)) = 0.49029 s; TTFT p95 =
0.49029 + 0.50776 + F ≈ 1.05 s ≤ 1.5 s → N_p,base = 2, binding compute. Ratio 2:2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from capacity import cli
from capacity.disagg import build_disagg_plan, transfer_s, workload_model
from capacity.disagg_latency import pool_latency
from capacity.errors import InfeasibleError, InputError
from capacity.inputs import PlanInputs
from capacity.loader import load_inputs

from .conftest import WORKED_EXAMPLE_PATH

EXAMPLE = WORKED_EXAMPLE_PATH.parent / "disaggregated.yaml"
RAG = {
    "workload.mean_input_tokens": 8192,
    "workload.mean_output_tokens": 256,
    "slo.tpot_max_ms": 30,
    "disaggregation.ttft_p95_s": 2,
}


@pytest.fixture
def inputs() -> PlanInputs:
    return load_inputs(EXAMPLE)


def _with(inputs: PlanInputs, **changes: float) -> PlanInputs:
    assert inputs.disaggregation is not None
    return dataclasses.replace(inputs, disaggregation=dataclasses.replace(inputs.disaggregation, **changes))


def test_transfer() -> None:
    assert transfer_s(8000, 163_840, 50e9) == pytest.approx(0.0262144)
    assert transfer_s(8000, 163_840, 10e9, latency_s=0.001) == pytest.approx(0.132072)


def test_decode_pool_at_the_workloads_context(inputs: PlanInputs) -> None:
    d = build_disagg_plan(inputs).decode
    assert d.step_fixed_s == pytest.approx(0.0077612, rel=1e-4)
    assert d.kv_token_s == pytest.approx(143.97e-9, rel=1e-4)
    assert (d.context_tokens, d.kv_limit_streams, d.b_max) == (8128, 32, 7)
    assert d.stream_tokens_per_s == pytest.approx(62.686, rel=1e-4)
    assert d.counts.throughput_gpus == pytest.approx(1.1668, rel=1e-4)
    assert d.counts.latency_gpus == pytest.approx(1.1668, rel=1e-4)
    assert d.kv_residence_s == pytest.approx(4.1101, rel=1e-4)
    assert d.counts.memory_gpus == pytest.approx(0.2527, rel=1e-3)
    assert (d.n_base, d.binding, d.n_replicas) == (2, "throughput", 3)


def test_prefill_pool_and_the_predicted_ttft(inputs: PlanInputs) -> None:
    plan = build_disagg_plan(inputs)
    p, at_base = plan.prefill, plan.predicted_at_base
    assert p.prefill_s == pytest.approx(0.50776, rel=1e-4)
    assert not p.batched
    assert (p.n_compute, p.n_base, p.binding, p.n_replicas) == (2, 2, "compute", 3)
    assert at_base.prefill.p95_s == pytest.approx(0.49029 + 0.50776, rel=1e-4)
    parts = at_base.prefill.p95_s + at_base.first_token_s + at_base.decode.kv_wait_s
    assert at_base.ttft_p95_s == pytest.approx(parts)
    assert at_base.ttft_p95_s <= 1.5
    assert plan.ratio == 1.0
    assert plan.predicted_at_headroom.ttft_p95_s < at_base.ttft_p95_s  # 3:3 waits less than 2:2


def test_a_tighter_ttft_slo_buys_prefill_gpus(inputs: PlanInputs) -> None:
    tight = build_disagg_plan(_with(inputs, ttft_p95_s=0.8)).prefill
    assert (tight.n_base, tight.binding) == (3, "ttft")
    assert build_disagg_plan(_with(inputs, ttft_p95_s=0.8)).predicted_at_base.ttft_p95_s <= 0.8


@pytest.mark.parametrize("rate", [3.0, 4.0])
def test_issue_29_rag_decode_is_sized_for_8k_contexts(rate: float) -> None:
    """The benchmark's RAG load: the old plan's 3:1 overloaded its single decode GPU (8,448-token
    contexts cost ten times the table's KV read per step); the plan now needs 2 and says why."""
    rag = load_inputs(EXAMPLE, RAG | {"workload.arrival_rate_per_s": rate})
    plan = build_disagg_plan(rag)
    assert (plan.prefill.n_base, plan.decode.n_base) == (3, 2)
    model, _, _ = workload_model(rag, rag.workload)
    assert pool_latency(model, 3, 1) is None  # one decode GPU cannot keep up at this context
    assert plan.predicted_at_base.tpot_p95_s <= 0.030


def test_slower_link_adds_transfer_to_ttft_and_kv_residence(inputs: PlanInputs) -> None:
    fast = build_disagg_plan(inputs)
    slow = build_disagg_plan(_with(inputs, link_bytes_per_s=10e9))
    assert slow.prefill.transfer_s == pytest.approx(0.131072)
    assert slow.decode.kv_residence_s - fast.decode.kv_residence_s == pytest.approx(0.131072 - 0.0262144)
    gained = slow.predicted_at_base.ttft_mean_s - fast.predicted_at_base.ttft_mean_s
    assert gained == pytest.approx(0.131072 - 0.0262144, rel=0.2)


def test_unreachable_objectives_are_infeasible(inputs: PlanInputs) -> None:
    with pytest.raises(InfeasibleError) as caught:
        build_disagg_plan(_with(inputs, ttft_p95_s=0.5))  # 0.508 s of prefill alone
    assert caught.value.key == "disaggregation.ttft_p95_s"
    with pytest.raises(InfeasibleError) as caught:
        build_disagg_plan(load_inputs(EXAMPLE, {"slo.tpot_max_ms": 8}))  # t_w + one 8k stream = 8.9 ms
    assert caught.value.key == "slo"


def test_ratio_table_over_lengths(inputs: PlanInputs) -> None:
    cells = {
        (c.input_tokens, c.output_tokens): (c.n_prefill, c.n_decode) for c in build_disagg_plan(inputs).table
    }
    assert len(cells) == 4 * 3
    assert cells[(8192, 256)] == (2, 2)
    assert cells[(256, 64)] == (1, 1)
    assert cells[(8192, 1024)][1] > cells[(8192, 64)][1]  # longer answers hold decode longer
    longer = dataclasses.replace(inputs.disaggregation, table_input_tokens=(8000, 16384), ttft_p95_s=0.6)
    cells = {
        (c.input_tokens, c.output_tokens): c.n_prefill
        for c in build_disagg_plan(dataclasses.replace(inputs, disaggregation=longer)).table
    }
    assert cells[(8000, 64)] is not None
    assert cells[(16384, 64)] is None  # S_p = 2 t_w + 1.024 s alone: out of reach, shown as "—"


def test_loader_reads_the_section_and_refuses_typos(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("link_gb_per_s: 50", "link_gbps: 50"), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_inputs(bad)
    assert caught.value.key == "disaggregation.link_gb_per_s"
    assert load_inputs(WORKED_EXAMPLE_PATH).disaggregation is None
    chunked = load_inputs(EXAMPLE, {"disaggregation.prefill_chunk_tokens": 2048})
    assert chunked.disaggregation is not None and chunked.disaggregation.prefill_chunk_tokens == 2048
    assert build_disagg_plan(chunked).prefill.prefill_s == pytest.approx(4 * 0.0077612 + 0.5, rel=1e-4)


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway plan")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def test_cli_appends_the_disaggregated_plan_and_keeps_the_aggregated_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run(["--config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "Ratio prefill:decode = 2:2 (1.00)" in out
    assert "N_p,base = 2 (binding: compute); with headroom N_p = 3" in out
    assert "Predicted per request" in out
    assert _run(["--config", str(WORKED_EXAMPLE_PATH)]) == 0
    assert "Disaggregated" not in capsys.readouterr().out
    assert _run(["--config", str(EXAMPLE), "--json", "--link-gb-per-s", "10"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["disaggregated"]["prefill"]["transfer_s"] == pytest.approx(0.131072)
    assert document["disaggregated"]["decode"]["counts"]["binding"] == "throughput"
    assert document["disaggregated"]["predicted_at_base"]["tpot_p95_s"] > 0
    assert "replicas" in document["plan"]  # the aggregated plan is still there
