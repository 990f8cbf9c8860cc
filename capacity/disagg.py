"""Two pools for one model: prefill GPUs sized by compute and TTFT, decode GPUs by the three barriers.

Prefill pool (each prompt runs alone on one GPU at the compute roof R_p; c GPUs are an M/M/c queue):

    S_p      = ī / R_p                                   prefill time of a mean prompt
    T_x      = latency + ī · kv_tok / B_link             KV transfer to the decode replica
    a        = λ · S_p                                   prefill GPUs busy on average (compute barrier)
    Wq95(c)  = max(0, ln(C(c, a/c) / 0.05) / (c / S_p − λ))   p95 queue wait, M/M/c (C = Erlang C)
    TTFT95(c)= Wq95(c) + S_p + T_x + 1 / v(B_max)        queue + prefill + transfer + first decode step
    N_p,base = the smallest c > a with TTFT95(c) ≤ TTFT SLO (so also ≥ ⌈a⌉)

Decode pool (the three barriers of `barriers.py`, on decode alone; a decode replica holds a request's KV
from the transfer to its last token):

    W_d      = T_x + ō / v(B_max)                         KV residence of a request on decode
    N_thr    = λ · ō / T_dec
    N_lat    = λ · (ō / v) / B_max                        streams decoding ÷ streams per GPU
    N_mem    = λ · W_d · (ī + ō) · kv_tok / M_KV
    N_d,base = max(⌈N_thr⌉, ⌈N_lat⌉, ⌈N_mem⌉)

B_max, v and T_dec come from the throughput table under the SLO without its TTFT term (decode alone
does not own the TTFT). Both pools then get headroom: N = max(min, ⌈N_base · (1 + r)⌉). The ratio is
N_p,base : N_d,base. Infeasible (`InfeasibleError` keyed `disaggregation.ttft_p95_s`) when
S_p + T_x + 1/v alone exceed the TTFT SLO: no number of prefill GPUs helps, only a faster link or GPU.

Approximations: exponential service (M/M/c) for a deterministic-ish prefill is pessimistic at low load;
the p95 TTFT adds the queue's p95 to mean prefill and transfer times; the table measured on aggregated
replicas understates decode-only speed (no prefill interference), so the decode pool is conservative.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from capacity import barriers, memory, queueing
from capacity.batch import select_b_max
from capacity.errors import InfeasibleError
from capacity.inputs import DisaggInputs, PlanInputs, Workload

P95_TAIL_RATIO = 0.05
_MAX_EXTRA_SERVERS = 100_000


@dataclass(frozen=True, slots=True)
class PrefillPool:
    prefill_s: float
    transfer_s: float
    first_step_s: float
    busy_gpus: float
    queue_p95_s: float
    ttft_p95_s: float
    n_base: int
    binding: str
    n_replicas: int


@dataclass(frozen=True, slots=True)
class DecodePool:
    b_max: int
    stream_tokens_per_s: float
    decode_tokens_per_s: float
    kv_residence_s: float
    counts: barriers.BarrierCounts
    n_replicas: int


@dataclass(frozen=True, slots=True)
class RatioCell:
    input_tokens: int
    output_tokens: int
    n_prefill: int | None
    n_decode: int | None


@dataclass(frozen=True, slots=True)
class DisaggPlan:
    prefill: PrefillPool
    decode: DecodePool
    ratio: float
    aggregated_n_base: int | None
    table: tuple[RatioCell, ...]


def transfer_s(
    input_tokens: float, kv_tok_bytes: float, link_bytes_per_s: float, latency_s: float = 0.0
) -> float:
    """T_x = latency + ī · kv_tok / B_link."""
    return latency_s + input_tokens * kv_tok_bytes / link_bytes_per_s


def queue_wait_p95_s(servers: int, arrival_rate_per_s: float, service_s: float) -> float:
    """p95 of the M/M/c wait: P(Wq > t) = C · e^(−(c/S − λ) t), so t95 = ln(C / 0.05) / (c/S − λ), or 0
    when fewer than 5 % of arrivals wait; `math.inf` when c/S ≤ λ (unstable)."""
    slack_per_s = servers / service_s - arrival_rate_per_s
    if slack_per_s <= 0:
        return math.inf
    waiting = queueing.erlang_c_probability(servers, arrival_rate_per_s * service_s / servers)
    if waiting <= P95_TAIL_RATIO:
        return 0.0
    return math.log(waiting / P95_TAIL_RATIO) / slack_per_s


def plan_prefill(
    workload: Workload,
    disagg: DisaggInputs,
    kv_tok_bytes: float,
    first_step_s: float,
    headroom: tuple[float, int],
) -> PrefillPool:
    """The prefill pool of the module docstring; raises `InfeasibleError` when no c meets the TTFT SLO."""
    lam, service_s = workload.arrival_rate_per_s, workload.mean_input_tokens / disagg.prefill_tokens_per_s
    link_s = transfer_s(
        workload.mean_input_tokens, kv_tok_bytes, disagg.link_bytes_per_s, disagg.link_latency_s
    )
    floor_s = service_s + link_s + first_step_s
    if floor_s > disagg.ttft_p95_s:
        raise InfeasibleError(
            "disaggregation.ttft_p95_s",
            f"prefill {service_s:.3f} s + transfer {link_s:.3f} s + first step {first_step_s:.3f} s = "
            f"{floor_s:.3f} s exceed the TTFT SLO before any queueing: a faster link or prefill GPU "
            "is needed",
        )
    busy = lam * service_s
    start = max(1, math.floor(busy) + 1)
    for servers in range(start, start + _MAX_EXTRA_SERVERS):
        wait_s = queue_wait_p95_s(servers, lam, service_s) if service_s > 0 else 0.0
        if wait_s + floor_s <= disagg.ttft_p95_s:
            break
    else:  # pragma: no cover - the wait falls to 0 long before
        raise InfeasibleError("disaggregation.ttft_p95_s", "no prefill pool size meets the TTFT SLO")
    binding = "ttft" if servers > barriers.ceil_count(busy) else "compute"
    n_base = max(servers, barriers.ceil_count(busy), 1)
    ratio, minimum = headroom
    return PrefillPool(
        prefill_s=service_s,
        transfer_s=link_s,
        first_step_s=first_step_s,
        busy_gpus=busy,
        queue_p95_s=wait_s,
        ttft_p95_s=wait_s + floor_s,
        n_base=n_base,
        binding=binding,
        n_replicas=barriers.replicas_with_headroom(n_base, ratio, minimum),
    )


def plan_decode(inputs: PlanInputs, workload: Workload, link_s: float) -> DecodePool:
    """The decode pool of the module docstring; `InfeasibleError` when no measured batch meets the SLO."""
    slo = dataclasses.replace(inputs.slo, ttft_p95_s=None)
    choice = select_b_max(inputs.throughput, slo, workload.mean_output_tokens)
    if choice is None:
        raise InfeasibleError(
            "slo", "no measured batch meets the decode SLO; relax it or measure smaller batches"
        )
    point, model, gpu = choice.point, inputs.model, inputs.gpu
    kv_tok = memory.kv_bytes_per_token(
        model.n_layers, model.n_kv_heads, model.head_dim, model.kv_bytes_per_element
    )
    weights = memory.weights_bytes(model.parameters, model.weight_bytes_per_parameter)
    budget = memory.kv_budget_bytes(gpu.memory_bytes, weights, gpu.overhead_bytes)
    if budget <= 0:
        raise InfeasibleError("gpu.memory_gb", "weights and overhead leave no KV budget on a decode GPU")
    lam, out = workload.arrival_rate_per_s, workload.mean_output_tokens
    decode_s = out / point.stream_tokens_per_s
    residence_s = link_s + decode_s
    counts = barriers.barrier_counts(
        barriers.throughput_gpus(lam, out, point.aggregate_tokens_per_s),
        barriers.latency_gpus(lam * decode_s, point.batch),
        barriers.memory_gpus(lam * residence_s, workload.context_tokens, kv_tok, budget),
    )
    n = barriers.replicas_with_headroom(counts.n_base, inputs.headroom.ratio, inputs.headroom.min_replicas)
    return DecodePool(
        point.batch, point.stream_tokens_per_s, point.aggregate_tokens_per_s, residence_s, counts, n
    )


def _pools(inputs: PlanInputs, disagg: DisaggInputs, workload: Workload) -> tuple[PrefillPool, DecodePool]:
    model = inputs.model
    kv_tok = memory.kv_bytes_per_token(
        model.n_layers, model.n_kv_heads, model.head_dim, model.kv_bytes_per_element
    )
    link_s = transfer_s(workload.mean_input_tokens, kv_tok, disagg.link_bytes_per_s, disagg.link_latency_s)
    decode = plan_decode(inputs, workload, link_s)
    headroom = (inputs.headroom.ratio, inputs.headroom.min_replicas)
    prefill = plan_prefill(workload, disagg, kv_tok, 1.0 / decode.stream_tokens_per_s, headroom)
    return prefill, decode


def build_disagg_plan(inputs: PlanInputs, aggregated_n_base: int | None = None) -> DisaggPlan:
    """Both pools for the input workload, and the N_p : N_d table over the configured lengths."""
    disagg = inputs.disaggregation
    if disagg is None:
        raise InfeasibleError("disaggregation", "the input has no disaggregation section")
    prefill, decode = _pools(inputs, disagg, inputs.workload)
    cells = []
    for input_tokens in disagg.table_input_tokens:
        for output_tokens in disagg.table_output_tokens:
            workload = dataclasses.replace(
                inputs.workload, mean_input_tokens=input_tokens, mean_output_tokens=output_tokens
            )
            try:
                p, d = _pools(inputs, disagg, workload)
                cells.append(RatioCell(input_tokens, output_tokens, p.n_base, d.counts.n_base))
            except InfeasibleError:
                cells.append(RatioCell(input_tokens, output_tokens, None, None))
    return DisaggPlan(prefill, decode, prefill.n_base / decode.counts.n_base, aggregated_n_base, tuple(cells))
