"""Planner validation (issue 29): the disaggregated plan against the mock's physics core in simulated time.

The two workloads of the disaggregation benchmark (docs/BENCHMARKS.md, "Prefill/decode"), each at the plan's
own split and rate: chat (256 in / 256 out, TTFT p95 ≤ 1 s, TPOT ≤ 30 ms) at 24 req/s, and RAG
(8,192 in / 256 out, TTFT p95 ≤ 2 s, TPOT ≤ 30 ms) at 3 req/s, where the old plan's 3:1 overloaded its
decode GPU. Every predicted figure (TTFT and TPOT, mean and p95) must be within 10 % of the simulated one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import plan_check
from bench.disagg_sim import DisaggLoad, PoolShape, simulate_disagg
from capacity.loader import load_inputs
from mock_engine.physics import load_profile
from mock_engine.physics.kv_link import KV_LINK_PRESETS

EXAMPLE = Path(__file__).resolve().parents[3] / "capacity" / "examples" / "disaggregated.yaml"
PROFILE = load_profile("h100-13b-fp16")
CHAT = {
    "workload.mean_input_tokens": 256,
    "workload.mean_output_tokens": 256,
    "slo.tpot_max_ms": 30,
    "disaggregation.ttft_p95_s": 1,
}
RAG = CHAT | {"workload.mean_input_tokens": 8192, "disaggregation.ttft_p95_s": 2}


def test_one_request_alone_follows_the_step_formula() -> None:
    """Prefill step, KV transfer, the one-token step that samples, then decode steps over a context
    growing from ī + 1 to ī + ō − 1: TPOT = t_w + (ī + ō/2) · t_kv exactly."""
    link = KV_LINK_PRESETS["rdma"]
    (timing,) = simulate_disagg(PROFILE, link, PoolShape(1, 1), DisaggLoad(1.0, 8192, 256, 1))
    t_w, t_kv, r_p = PROFILE.weight_read_s, PROFILE.kv_read_s_per_token, PROFILE.prefill.tokens_per_s
    transfer = link.transfer_s(8192, PROFILE.kv_bytes_per_token)
    assert timing.ttft_s == pytest.approx(t_w + 8192 / r_p + transfer + t_w + 1 / r_p)
    assert timing.tpot_s == pytest.approx(t_w + (8192 + 128) * t_kv)


def test_least_load_spreads_requests_and_keeps_arrival_order() -> None:
    timings = simulate_disagg(
        PROFILE, KV_LINK_PRESETS["rdma"], PoolShape(2, 2), DisaggLoad(30.0, 256, 16, 200, seed=5)
    )
    assert len(timings) == 200
    assert [t.arrival_s for t in timings] == sorted(t.arrival_s for t in timings)
    assert all(t.ttft_s > 0 and t.tpot_s is not None and t.tpot_s > 0 for t in timings)


@pytest.mark.parametrize(
    ("workload", "rate", "requests", "split"),
    [(CHAT, 24.0, 3000, (1, 1)), (RAG, 3.0, 2000, (3, 2))],
    ids=["chat-24", "rag-3"],
)
def test_plan_matches_the_simulated_pool_within_10_percent(
    workload: dict[str, float], rate: float, requests: int, split: tuple[int, int]
) -> None:
    inputs = load_inputs(EXAMPLE, workload | {"workload.arrival_rate_per_s": rate})
    check = plan_check.check_rate(inputs, PROFILE, requests=requests, seeds=[1])
    assert (check.prefill_replicas, check.decode_replicas) == split
    assert check.requests == requests - requests // 10
    errors = check.errors()
    assert set(errors) == set(plan_check.FIGURES)
    assert all(abs(error) <= 0.10 for error in errors.values()), errors
    assert check.passes()


def test_the_profile_must_be_the_planned_hardware() -> None:
    inputs = load_inputs(EXAMPLE, RAG | {"disaggregation.prefill_tokens_per_s": 20_000})
    with pytest.raises(ValueError, match="prefill tokens/s"):
        plan_check.check_rate(inputs, PROFILE, requests=20, seeds=[1])


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench plan-check")
    plan_check.add_arguments(parser)
    return plan_check.run(parser.parse_args(argv))


def test_command_prints_the_table_and_fails_outside_the_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--config",
        str(EXAMPLE),
        "--input-tokens",
        "256",
        "--output-tokens",
        "256",
        "--tpot-max-ms",
        "30",
    ]
    argv += ["--disagg-ttft-p95-s", "1", "--rates", "8", "--requests", "300", "--seeds", "1"]
    assert _run([*argv, "--tolerance", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "| 8 | 1:1 | 270 |" in out and "| yes |" in out
    assert _run([*argv, "--tolerance", "0"]) == 1
    assert "| NO |" in capsys.readouterr().out
    assert _run([*argv, "--arrival-rate", "-1"]) == 2
    assert "workload.arrival_rate_per_s (from --arrival-rate)" in capsys.readouterr().err
