"""The disaggregated plan against hand-computed figures (capacity/examples/disaggregated.yaml).

Inputs: 13B FP16 (kv_tok = 2·40·8·128·2 = 163,840 B), H100 80 GB (M_KV = 80 − 26 − 10 = 44 GB),
λ = 2/s, ī = 8,000, ō = 256, R_p = 16,000 tok/s, link 50 GB/s, TTFT p95 SLO 1.5 s, TPOT ≤ 16.7 ms
(B_max = 64, v = 68 tok/s, T_dec = 4,352 tok/s).

Prefill: S_p = 8,000 / 16,000 = 0.5 s; T_x = 8,000 · 163,840 / 50e9 = 0.0262144 s; first step 1/68 s;
a = λ · S_p = 1.0. c = 2: Erlang C(2, a = 1) = 1/3 (B(1) = 1/2, B(2) = 1/5, C = 0.2 / (1 − 0.5 · 0.8));
c/S − λ = 2/s; Wq95 = ln((1/3) / 0.05) / 2 = 0.948560 s; TTFT95 = 0.948560 + 0.5 + 0.0262144 + 0.0147059
= 1.489480 s ≤ 1.5 → N_p = 2 (binding ttft: the compute barrier alone says ⌈1.0⌉ = 1).
With a 1.0 s SLO: c = 3, C(3, 1) = 0.0625 / 0.6875 = 1/11, Wq95 = ln((1/11) / 0.05) / 4 = 0.149459 s → 3.

Decode: ō / v = 3.764706 s; W_d = 3.790920 s; N_thr = 2 · 256 / 4,352 = 0.117647; N_lat = 2 · 3.764706 / 64
= 0.117647; N_mem = 2 · 3.790920 · 8,256 · 163,840 / 44e9 = 0.233084 → N_d = 1 (binding memory). Ratio 2:1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pytest

from capacity import cli
from capacity.disagg import build_disagg_plan, queue_wait_p95_s, transfer_s
from capacity.errors import InfeasibleError, InputError
from capacity.inputs import PlanInputs
from capacity.loader import load_inputs

from .conftest import WORKED_EXAMPLE_PATH

EXAMPLE = WORKED_EXAMPLE_PATH.parent / "disaggregated.yaml"


@pytest.fixture
def inputs() -> PlanInputs:
    return load_inputs(EXAMPLE)


def _with(inputs: PlanInputs, **changes: float) -> PlanInputs:
    assert inputs.disaggregation is not None
    return dataclasses.replace(inputs, disaggregation=dataclasses.replace(inputs.disaggregation, **changes))


def test_formulas() -> None:
    assert transfer_s(8000, 163_840, 50e9) == pytest.approx(0.0262144)
    assert transfer_s(8000, 163_840, 10e9, latency_s=0.001) == pytest.approx(0.132072)
    assert queue_wait_p95_s(2, 2.0, 0.5) == pytest.approx(math.log((1 / 3) / 0.05) / 2)
    assert queue_wait_p95_s(3, 2.0, 0.5) == pytest.approx(math.log((1 / 11) / 0.05) / 4)
    assert queue_wait_p95_s(1, 2.0, 0.5) == math.inf  # c / S = λ: unstable
    assert queue_wait_p95_s(10, 2.0, 0.5) == 0.0  # fewer than 5 % of arrivals wait


def test_prefill_pool_from_ttft(inputs: PlanInputs) -> None:
    p = build_disagg_plan(inputs).prefill
    assert p.prefill_s == pytest.approx(0.5)
    assert p.transfer_s == pytest.approx(0.0262144)
    assert p.busy_gpus == pytest.approx(1.0)
    assert p.queue_p95_s == pytest.approx(0.948560, abs=1e-6)
    assert p.ttft_p95_s == pytest.approx(1.489480, abs=1e-6)
    assert (p.n_base, p.binding, p.n_replicas) == (2, "ttft", 3)  # headroom 0.5 by default
    tighter = build_disagg_plan(_with(inputs, ttft_p95_s=1.0)).prefill
    assert tighter.n_base == 3
    assert tighter.queue_p95_s == pytest.approx(0.149459, abs=1e-6)


def test_decode_pool_and_ratio(inputs: PlanInputs) -> None:
    plan = build_disagg_plan(inputs, aggregated_n_base=1)
    d = plan.decode
    assert (d.b_max, d.stream_tokens_per_s) == (64, 68)
    assert d.kv_residence_s == pytest.approx(0.0262144 + 256 / 68)
    assert d.counts.throughput_gpus == pytest.approx(0.117647, abs=1e-6)
    assert d.counts.latency_gpus == pytest.approx(0.117647, abs=1e-6)
    assert d.counts.memory_gpus == pytest.approx(0.233084, abs=1e-6)
    assert (d.counts.n_base, str(d.counts.binding)) == (1, "memory")
    assert plan.ratio == 2.0


def test_slower_link_adds_transfer_to_ttft_and_kv_residence(inputs: PlanInputs) -> None:
    fast = build_disagg_plan(inputs)
    slow = build_disagg_plan(_with(inputs, link_bytes_per_s=10e9))
    assert slow.prefill.transfer_s == pytest.approx(0.131072)
    assert slow.prefill.n_base == 3  # at c = 2: 1.489 + 0.105 s > 1.5 s
    assert slow.prefill.ttft_p95_s == pytest.approx(0.149459 + 0.5 + 0.131072 + 1 / 68, abs=1e-6)
    assert fast.prefill.n_base == 2
    assert slow.decode.kv_residence_s - fast.decode.kv_residence_s == pytest.approx(0.131072 - 0.0262144)


def test_unreachable_ttft_is_infeasible(inputs: PlanInputs) -> None:
    with pytest.raises(InfeasibleError) as caught:
        build_disagg_plan(_with(inputs, ttft_p95_s=0.5))  # 0.5 s prefill + transfer + step > 0.5 s
    assert caught.value.key == "disaggregation.ttft_p95_s"


def test_ratio_table_over_lengths(inputs: PlanInputs) -> None:
    cells = {
        (c.input_tokens, c.output_tokens): (c.n_prefill, c.n_decode) for c in build_disagg_plan(inputs).table
    }
    assert len(cells) == 4 * 3
    assert cells[(8192, 256)] == (3, 1)  # 8,192 / 16,000 = 0.512 s: a = 1.024, so c = 2 is no longer enough
    assert cells[(256, 64)] == (1, 1)
    slow = {
        (c.input_tokens, c.output_tokens): c.n_prefill
        for c in build_disagg_plan(_with(inputs, ttft_p95_s=0.55)).table
    }
    assert slow[(8192, 64)] is None  # S_p alone is 0.512 s: out of reach, shown as "—"


def test_loader_reads_the_section_and_refuses_typos(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("link_gb_per_s: 50", "link_gbps: 50"), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        load_inputs(bad)
    assert caught.value.key == "disaggregation.link_gb_per_s"
    assert load_inputs(WORKED_EXAMPLE_PATH).disaggregation is None


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="llm-gateway plan")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def test_cli_appends_the_disaggregated_plan_and_keeps_the_aggregated_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _run(["--config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "Ratio prefill:decode = 2:1 (2.00)" in out
    assert "N_p,base = 2 (binding: ttft); with headroom N_p = 3" in out
    assert _run(["--config", str(WORKED_EXAMPLE_PATH)]) == 0
    assert "Disaggregated" not in capsys.readouterr().out
    assert _run(["--config", str(EXAMPLE), "--json", "--link-gb-per-s", "10"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["disaggregated"]["prefill"]["transfer_s"] == pytest.approx(0.131072)
    assert document["disaggregated"]["decode"]["counts"]["binding"] == "memory"
    assert "replicas" in document["plan"]  # the aggregated plan is still there
