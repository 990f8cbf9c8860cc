"""Render a plan: a readable table (with the formula behind each figure) or a JSON document.

The table is for a person deciding on a fleet; the JSON (`plan_document`) is for scripts and holds
every input and output with units in the key names. Infinite values (an unstable queue, no spare
capacity to drain a backlog) become `null` in JSON and "∞" in the table.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from capacity.inputs import GB_BYTES, PlanInputs, Slo
from capacity.results import Plan

Row = tuple[str, str, str]

_LABEL_WIDTH = 30
_VALUE_WIDTH = 22


def _n(value: float, digits: int = 0) -> str:
    """Thousands-separated number; ∞ for infinity."""
    return "∞" if math.isinf(value) else f"{value:,.{digits}f}"


def _gb(value_bytes: float) -> str:
    return f"{value_bytes / GB_BYTES:,.1f} GB"


def _x(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.2f}x"


def describe_slo(slo: Slo) -> str:
    """The SLO terms in words, e.g. 'TPOT ≤ 16.7 ms'."""
    terms = []
    if slo.tpot_max_s is not None:
        terms.append(f"TPOT ≤ {slo.tpot_max_s * 1000:g} ms")
    if slo.min_stream_tokens_per_s is not None:
        terms.append(f"≥ {slo.min_stream_tokens_per_s:g} tok/s per stream")
    if slo.e2e_p95_s is not None:
        terms.append(f"e2e p95 ≤ {slo.e2e_p95_s:g} s")
    if slo.ttft_p95_s is not None:
        terms.append(f"TTFT p95 ≤ {slo.ttft_p95_s:g} s")
    return ", ".join(terms)


def _memory_rows(inputs: PlanInputs, plan: Plan) -> list[Row]:
    model, gpu, mem = inputs.model, inputs.gpu, plan.memory
    return [
        (
            "KV bytes per token kv_tok",
            f"{_n(mem.kv_bytes_per_token)} B",
            f"2 * {model.n_layers} layers * {model.n_kv_heads} KV heads * {model.head_dim} * "
            f"{model.kv_bytes_per_element:g} B",
        ),
        (
            "Weights",
            _gb(mem.weights_bytes),
            f"{model.parameters / 1e9:g}·10^9 parameters * {model.weight_bytes_per_parameter:g} B",
        ),
        (
            "KV budget M_KV",
            _gb(mem.kv_budget_bytes),
            f"{_gb(gpu.memory_bytes)} - {_gb(mem.weights_bytes)} - {_gb(gpu.overhead_bytes)} overhead",
        ),
        ("KV tokens", _n(mem.kv_capacity_tokens), "M_KV / kv_tok"),
        (
            "Whole contexts in KV",
            _n(mem.kv_resident_requests, 1),
            f"KV tokens / ctx {_n(mem.context_tokens)}",
        ),
    ]


def _operating_rows(inputs: PlanInputs, plan: Plan) -> list[Row]:
    op = plan.operating
    limit = f"next batch breaks {op.limited_by}" if op.limited_by else "largest measured batch"
    rows: list[Row] = [
        ("B_max", str(op.b_max), f"largest measured batch meeting the SLO ({limit})"),
        (
            "Per-stream speed v",
            f"{_n(op.stream_tokens_per_s, 1)} tok/s",
            ""
            if op.required_stream_tokens_per_s is None
            else f"SLO needs ≥ {_n(op.required_stream_tokens_per_s, 1)} tok/s",
        ),
        ("Aggregate T_dec at B_max", f"{_n(op.decode_tokens_per_s)} tok/s", "measured"),
    ]
    if op.roofline_stream_tokens_per_s is not None and op.roofline_efficiency_ratio is not None:
        rows.append(
            (
                "Bandwidth roofline",
                f"{_n(op.roofline_stream_tokens_per_s, 1)} tok/s",
                f"measured v is {op.roofline_efficiency_ratio:.0%} of (weights + B·ctx·kv_tok) / bandwidth",
            )
        )
    rows += [
        (
            "W (time in system)",
            f"{op.time_in_system_s:.2f} s",
            f"TTFT {op.ttft_mean_s:g} s + ō / v = {op.ttft_mean_s:g} + "
            f"{_n(inputs.workload.mean_output_tokens)} / {_n(op.stream_tokens_per_s, 1)}",
        ),
        (
            "L (Little's law)",
            f"{_n(op.concurrency_requests, 1)} requests",
            f"λ · W = {inputs.workload.arrival_rate_per_s:g} * {op.time_in_system_s:.2f}",
        ),
    ]
    return rows


def _replica_rows(inputs: PlanInputs, plan: Plan) -> list[Row]:
    op, reps, wl = plan.operating, plan.replicas, inputs.workload
    demand = wl.arrival_rate_per_s * wl.mean_output_tokens
    return [
        (
            "Throughput N_thr",
            f"{reps.n_throughput}  ({reps.throughput_gpus:.2f})",
            f"λ·ō / T_dec = {_n(demand)} / {_n(op.decode_tokens_per_s)}",
        ),
        (
            "Latency N_lat",
            f"{reps.n_latency}  ({reps.latency_gpus:.2f})",
            f"L / B_max = {_n(op.concurrency_requests, 1)} / {op.b_max}",
        ),
        ("Memory N_mem", f"{reps.n_memory}  ({reps.memory_gpus:.2f})", "L·ctx·kv_tok / M_KV"),
        ("N_base", str(reps.n_base), f"binding barrier: {reps.binding}"),
        ("N with headroom", str(reps.n_replicas), f"⌈N_base * (1 + {reps.headroom_ratio:g})⌉"),
    ]


def _utilisation_rows(plan: Plan) -> list[Row]:
    u, reps = plan.utilisation, plan.replicas
    n, lost = reps.n_replicas, reps.n_replicas - 1
    return [
        (f"rho at N_base = {reps.n_base}", f"{u.at_base_ratio:.2f}", "λ·ō / (n · T_dec)"),
        (
            f"rho at N = {n}",
            f"{u.at_n_ratio:.2f}",
            f"M/M/1 W/S {_x(u.mm1_multiplier_ratio)}, M/M/c (c = {n}) {_x(u.mmc_multiplier_ratio)}",
        ),
        (
            f"rho with one lost (N - 1 = {lost})",
            _n(u.one_lost_ratio, 2),
            f"M/M/1 W/S {_x(u.one_lost_mm1_multiplier_ratio)}, "
            f"M/M/c (c = {lost}) {_x(u.one_lost_mmc_multiplier_ratio)}",
        ),
        ("Batch occupancy", f"{u.occupancy_ratio:.2f}", "L / (N · B_max)"),
    ]


def _spike_rows(inputs: PlanInputs, plan: Plan) -> list[Row]:
    sp, op = plan.spike, plan.operating
    return [
        (
            "Demand vs capacity",
            f"{_n(sp.demand_tokens_per_s)} tok/s",
            f"k·λ·ō vs N · T_dec = {_n(sp.capacity_tokens_per_s)} tok/s",
        ),
        (
            "Backlog",
            f"{_n(sp.backlog_tokens)} tokens",
            f"≈ {_n(sp.backlog_requests)} requests of {_n(inputs.workload.mean_output_tokens)} tokens",
        ),
        (
            f"Replicas for rho ≤ {sp.target_utilisation_ratio:g}",
            str(sp.n_replicas),
            f"⌈{_n(sp.demand_tokens_per_s)} / "
            f"({sp.target_utilisation_ratio:g} * {_n(op.decode_tokens_per_s)})⌉",
        ),
        (
            "Backlog drain",
            f"{_n(sp.drain_s)} s",
            f"backlog / ({sp.n_replicas} * {_n(op.decode_tokens_per_s)} - {_n(sp.demand_tokens_per_s)})",
        ),
    ]


def _cost_rows(inputs: PlanInputs, plan: Plan) -> list[Row]:
    c, op = plan.cost, plan.operating
    compare = inputs.throughput.at_batch(c.compare_batch)
    return [
        (
            f"At B_max = {op.b_max}",
            f"${c.operating_usd_per_million_tokens:.2f} / M tokens",
            f"{_n(op.decode_tokens_per_s)} tok/s",
        ),
        (
            f"At batch {c.compare_batch}",
            f"${c.compare_usd_per_million_tokens:.2f} / M tokens",
            f"{_n(compare.aggregate_tokens_per_s)} tok/s",
        ),
        (
            f"At {c.useful_load_ratio:.0%} useful load",
            f"${c.useful_load_usd_per_million_tokens:.2f} / M tokens",
            f"cost at B_max / {c.useful_load_ratio:g}",
        ),
        (
            f"Planned fleet ({plan.replicas.n_replicas} GPUs)",
            f"${c.fleet_usd_per_million_tokens:.2f} / M tokens",
            f"${c.fleet_usd_per_hour:,.2f}/h at the offered λ·ō",
        ),
    ]


def _section(title: str, rows: list[Row]) -> list[str]:
    lines = [title]
    for label, value, detail in rows:
        lines.append(f"  {label:<{_LABEL_WIDTH}} {value:<{_VALUE_WIDTH}} {detail}".rstrip())
    return lines


def render_table(inputs: PlanInputs, plan: Plan, source: str) -> str:
    """The plan as an aligned text table, one section per question, formulas on the right."""
    wl, sp = inputs.workload, inputs.spike
    lines = [
        f"Capacity plan: {inputs.model.name} on {inputs.gpu.name}   (inputs: {source})",
        f"Workload: λ {wl.arrival_rate_per_s:g} req/s, ī {_n(wl.mean_input_tokens)}, ō "
        f"{_n(wl.mean_output_tokens)} tokens (ctx {_n(wl.context_tokens)});  SLO: {describe_slo(inputs.slo)}",
        "",
    ]
    n = plan.replicas.n_replicas
    cold = f"Cold start: {sp.factor:g}x spike on N = {n}, {sp.cold_start_s:g} s until new replicas serve"
    sections = [
        ("Memory (per replica)", _memory_rows(inputs, plan)),
        ("Operating point", _operating_rows(inputs, plan)),
        ("Replicas", _replica_rows(inputs, plan)),
        ("Utilisation and queueing", _utilisation_rows(plan)),
        (cold, _spike_rows(inputs, plan)),
        (f"Cost (${inputs.gpu.usd_per_hour:,.2f} per GPU-hour)", _cost_rows(inputs, plan)),
    ]
    for index, (title, rows) in enumerate(sections):
        if index:
            lines.append("")
        lines += _section(title, rows)
    if plan.notes:
        lines += ["", "Notes"] + [f"  - {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"


def _finite(value: Any) -> Any:
    """Replace non-finite floats by None, recursively (JSON has no infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def plan_document(inputs: PlanInputs, plan: Plan, source: str) -> dict[str, Any]:
    """The JSON-ready document: {"source", "inputs", "plan"}, units in every key name."""
    document = {"source": source, "inputs": dataclasses.asdict(inputs), "plan": dataclasses.asdict(plan)}
    cleaned: dict[str, Any] = _finite(document)
    return cleaned


def render_json(inputs: PlanInputs, plan: Plan, source: str) -> str:
    """`plan_document` as indented JSON text."""
    return json.dumps(plan_document(inputs, plan, source), indent=2, ensure_ascii=False) + "\n"
