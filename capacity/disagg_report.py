"""Print a disaggregated plan: the decode pool, the prefill pool, the ratio, the predicted latencies, and
the ratio table.

The text follows the aggregated table (`report.render_table`); the JSON is one more key,
`disaggregated`, of the aggregated document. Formulas are in `capacity.disagg` and the modules it names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capacity.disagg import DisaggPlan
from capacity.disagg_latency import PoolLatency
from capacity.inputs import PlanInputs


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _predicted(label: str, latency: PoolLatency) -> str:
    split = f"{latency.prefill_replicas}:{latency.decode_replicas}"
    return (
        f"  at {label} {split}: TTFT mean {_ms(latency.ttft_mean_s)}, p95 {_ms(latency.ttft_p95_s)};"
        f" TPOT mean {_ms(latency.tpot_mean_s)}, p95 {_ms(latency.tpot_p95_s)}"
    )


def render_disagg_table(inputs: PlanInputs, plan: DisaggPlan) -> str:
    disagg, workload = inputs.disaggregation, inputs.workload
    assert disagg is not None
    p, d, base = plan.prefill, plan.decode, plan.predicted_at_base
    chunk = "none" if disagg.prefill_chunk_tokens is None else f"{disagg.prefill_chunk_tokens:,}"
    lines = [
        "",
        "Disaggregated pool (prefill GPUs + decode GPUs, KV over the link)",
        f"  link {disagg.link_bytes_per_s / 1e9:g} GB/s,"
        f" prefill roof R_p = {disagg.prefill_tokens_per_s:,.0f} tok/s, chunk {chunk} tokens,"
        f" TTFT p95 SLO {disagg.ttft_p95_s:g} s",
        "Decode pool (step = t_w + B · ctx · t_kv, fitted to the throughput table)",
        f"  t_w = {_ms(d.step_fixed_s)}, t_kv = {d.kv_token_s * 1e9:.1f} ns per context token;"
        f" mean context c̄ = ī + ō/2 = {d.context_tokens:,.0f}",
        f"  TPOT_max {_ms(d.tpot_max_s)}: B_max = {d.b_max} (KV holds {d.kv_limit_streams} streams),"
        f" v = {d.stream_tokens_per_s:.1f} tok/s, T_dec = {d.decode_tokens_per_s:,.0f} tok/s,"
        f" W_d = T_x + ō / v = {d.kv_residence_s:.3f} s",
        f"  N_thr = {d.counts.throughput_gpus:.2f}, N_lat = {d.counts.latency_gpus:.2f},"
        f" N_mem = {d.counts.memory_gpus:.2f} → N_d,base = {d.n_base} (binding: {d.binding});"
        f" with headroom N_d = {d.n_replicas}",
        "Prefill pool",
        f"  S_p = ⌈ī / chunk⌉ · t_w + ī / R_p = {_ms(p.prefill_s)}"
        + (" (short prompts share steps)" if p.batched else ""),
        f"  T_x = ī · kv_tok / B_link = {p.transfer_s * 1000:.2f} ms",
        f"  {p.busy_gpus:.2f} busy GPUs; keeps up from {p.n_compute}; TTFT p95 at {p.n_base} ="
        f" prefill {_ms(base.prefill.p95_s)} + first decode token {_ms(base.first_token_s)}"
        f" + KV wait {_ms(base.decode.kv_wait_s)} = {_ms(base.ttft_p95_s)}",
        f"  N_p,base = {p.n_base} (binding: {p.binding}); with headroom N_p = {p.n_replicas}",
        f"Ratio prefill:decode = {p.n_base}:{d.n_base} ({plan.ratio:.2f}); "
        f"{p.n_base + d.n_base} GPUs before headroom"
        + (
            f" (aggregated plan above: N_base = {plan.aggregated_n_base}, its table hides prefill cost)"
            if plan.aggregated_n_base is not None
            else ""
        ),
        "Predicted per request (validated against the mock engine: docs/CAPACITY.md)",
        _predicted("N_base", base),
        _predicted("N", plan.predicted_at_headroom),
        "",
        "N_p,base:N_d,base by mean input (rows) and output (columns) tokens"
        f" at λ = {workload.arrival_rate_per_s:g}/s (— : SLO out of reach)",
    ]
    outputs = disagg.table_output_tokens
    corner = "ī \\ ō"
    lines.append("  " + f"{corner:>8}" + "".join(f"{o:>10}" for o in outputs))
    for input_tokens in disagg.table_input_tokens:
        row = [c for c in plan.table if c.input_tokens == input_tokens]
        cells = "".join(f"{'—' if c.n_prefill is None else f'{c.n_prefill}:{c.n_decode}':>10}" for c in row)
        lines.append("  " + f"{input_tokens:>8}" + cells)
    return "\n".join(lines) + "\n"


def disagg_document(plan: DisaggPlan) -> dict[str, Any]:
    """The plan as plain JSON-ready values (dataclass fields, units in the names)."""
    document = dataclasses.asdict(plan)
    document["decode"]["counts"]["binding"] = str(plan.decode.counts.binding)
    document["table"] = [dataclasses.asdict(cell) for cell in plan.table]
    return document
