"""Print a disaggregated plan: the prefill pool, the decode pool, the ratio, and the ratio table.

The text follows the aggregated table (`report.render_table`); the JSON is one more key,
`disaggregated`, of the aggregated document. Formulas are in `capacity.disagg`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capacity.disagg import DisaggPlan
from capacity.inputs import PlanInputs


def render_disagg_table(inputs: PlanInputs, plan: DisaggPlan) -> str:
    disagg, workload = inputs.disaggregation, inputs.workload
    assert disagg is not None
    p, d = plan.prefill, plan.decode
    lines = [
        "",
        "Disaggregated pool (prefill GPUs + decode GPUs, KV over the link)",
        f"  link {disagg.link_bytes_per_s / 1e9:g} GB/s,"
        f" prefill roof R_p = {disagg.prefill_tokens_per_s:,.0f} tok/s,"
        f" TTFT p95 SLO {disagg.ttft_p95_s:g} s",
        "Prefill pool",
        f"  S_p = ī / R_p = {workload.mean_input_tokens:,.0f} / {disagg.prefill_tokens_per_s:,.0f}"
        f" = {p.prefill_s * 1000:.1f} ms",
        f"  T_x = ī · kv_tok / B_link = {p.transfer_s * 1000:.2f} ms",
        f"  a = λ · S_p = {p.busy_gpus:.2f} busy GPUs (compute barrier {max(1, -(-p.busy_gpus // 1)):.0f})",
        f"  TTFT p95 = queue {p.queue_p95_s * 1000:.1f} ms + prefill {p.prefill_s * 1000:.1f} ms"
        f" + transfer {p.transfer_s * 1000:.2f} ms + first step {p.first_step_s * 1000:.1f} ms"
        f" = {p.ttft_p95_s * 1000:.1f} ms",
        f"  N_p,base = {p.n_base} (binding: {p.binding}); with headroom N_p = {p.n_replicas}",
        "Decode pool",
        f"  B_max = {d.b_max}, v = {d.stream_tokens_per_s:g} tok/s,"
        f" T_dec = {d.decode_tokens_per_s:,.0f} tok/s,"
        f" KV residence W_d = T_x + ō / v = {d.kv_residence_s:.3f} s",
        f"  N_thr = {d.counts.throughput_gpus:.2f}, N_lat = {d.counts.latency_gpus:.2f},"
        f" N_mem = {d.counts.memory_gpus:.2f} → N_d,base = {d.counts.n_base} (binding: {d.counts.binding});"
        f" with headroom N_d = {d.n_replicas}",
        f"Ratio prefill:decode = {p.n_base}:{d.counts.n_base} ({plan.ratio:.2f}); "
        f"{p.n_base + d.counts.n_base} GPUs before headroom"
        + (
            f" (aggregated plan above: N_base = {plan.aggregated_n_base}, its table hides prefill cost)"
            if plan.aggregated_n_base is not None
            else ""
        ),
        "",
        "N_p,base:N_d,base by mean input (rows) and output (columns) tokens"
        f" at λ = {workload.arrival_rate_per_s:g}/s (— : TTFT SLO out of reach)",
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
