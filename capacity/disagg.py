"""Two pools for one model: decode GPUs sized by TPOT, prefill GPUs by TTFT, and what each will see.

Decode pool, at the workload's context (the step line of `decode_step`, fitted to the throughput table;
a decode replica holds a request's KV from the transfer to its last token):

    c̄        = ī + ō / 2                                       mean context of a decoding stream
    TPOT_max = 1 / max(1 / SLO TPOT, SLO stream speed); with neither, 1 / v of the table's B_max row
    n_kv     = ⌊M_KV / (kv_tok · (ī + ō))⌋                     streams whose KV fits one replica
    B_max    = the largest B with step(B, c̄) ≤ TPOT_max, at most n_kv and the largest measured batch
    v        = 1 / step(B_max, c̄),   T_dec = B_max · v,   W_d = T_x + ō / v
    N_thr    = λ · ō / T_dec     N_lat = λ · (ō / v) / B_max     N_mem = λ · W_d · (ī + ō) · kv_tok / M_KV
    N_d,base = the smallest D ≥ max(⌈N_thr⌉, ⌈N_lat⌉, ⌈N_mem⌉, 1) whose predicted TPOT p95 ≤ TPOT_max
               and p95 streams per replica ≤ B_max (`decode_queue`); binding `tpot` when above the barriers

Prefill pool (S_p, the prefill latency P and TTFT in `disagg_latency`):

    a        = λ · S_p busy GPUs (λ · ī / R_p when short prompts share steps)
    N_p,base = the smallest c at which the prefill keeps up (binding `compute`) and the predicted TTFT
               p95, with the decode pool above, ≤ the TTFT SLO (binding `ttft` when that needs more)

Both pools then get headroom: N = max(min, ⌈N_base · (1 + r)⌉). The ratio is N_p,base : N_d,base, and
the plan carries the predicted TTFT and TPOT (mean, p95) at N_base and at N. Infeasible
(`InfeasibleError`): keyed `slo` when not one stream meets TPOT_max at this context; keyed
`disaggregation.ttft_p95_s` when S_p + T_x + t_w alone exceed the TTFT SLO, or no prefill pool meets it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from capacity import barriers, memory
from capacity.batch import required_stream_tokens_per_s, select_b_max
from capacity.decode_step import DecodeStepModel, fit_decode_step
from capacity.disagg_latency import (
    PoolLatency,
    PoolModel,
    PrefillLatency,
    combine,
    decode_pool_latency,
    pool_latency,
    pool_model,
    prefill_latency,
)
from capacity.errors import InfeasibleError
from capacity.inputs import DisaggInputs, PlanInputs, Workload

_MAX_EXTRA_REPLICAS = 1_000


@dataclass(frozen=True, slots=True)
class PrefillPool:
    prefill_s: float
    batched: bool
    transfer_s: float
    busy_gpus: float
    n_compute: int
    n_base: int
    binding: str
    n_replicas: int


@dataclass(frozen=True, slots=True)
class DecodePool:
    context_tokens: float
    step_fixed_s: float
    kv_token_s: float
    tpot_max_s: float
    kv_limit_streams: int
    b_max: int
    stream_tokens_per_s: float
    decode_tokens_per_s: float
    kv_residence_s: float
    counts: barriers.BarrierCounts
    n_base: int
    binding: str
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
    predicted_at_base: PoolLatency
    predicted_at_headroom: PoolLatency
    aggregated_n_base: int | None
    table: tuple[RatioCell, ...]


def transfer_s(
    input_tokens: float, kv_tok_bytes: float, link_bytes_per_s: float, latency_s: float = 0.0
) -> float:
    """T_x = latency + ī · kv_tok / B_link."""
    return latency_s + input_tokens * kv_tok_bytes / link_bytes_per_s


def tpot_max_s(inputs: PlanInputs, workload: Workload) -> float:
    """TPOT_max of the module docstring; `InfeasibleError` when the table has no row for the SLO."""
    required = required_stream_tokens_per_s(inputs.slo)
    if required is not None:
        return 1.0 / required
    choice = select_b_max(
        inputs.throughput, dataclasses.replace(inputs.slo, ttft_p95_s=None), workload.mean_output_tokens
    )
    if choice is None:
        raise InfeasibleError(
            "slo", "no measured batch meets the decode SLO; relax it or measure smaller batches"
        )
    return 1.0 / choice.point.stream_tokens_per_s


def _first_replicas(ok: Callable[[int], bool], start: int, key: str, what: str) -> int:
    """The smallest n ≥ start with ok(n); `InfeasibleError` (keyed `key`) after `_MAX_EXTRA_REPLICAS`."""
    for n in range(start, start + _MAX_EXTRA_REPLICAS):
        if ok(n):
            return n
    raise InfeasibleError(key, f"no {what} pool of up to {start + _MAX_EXTRA_REPLICAS - 1} replicas meets it")


def plan_decode(
    inputs: PlanInputs, workload: Workload, model: PoolModel, kv_tok: float, budget: float
) -> DecodePool:
    """The decode pool of the module docstring."""
    step, lam, out = model.step, workload.arrival_rate_per_s, workload.mean_output_tokens
    ctx = workload.mean_input_tokens + out / 2
    target_s = tpot_max_s(inputs, workload)
    b_max = min(step.largest_batch_within(target_s, ctx), model.kv_limit_streams)
    if b_max < 1:
        raise InfeasibleError(
            "slo",
            f"one stream at context {ctx:,.0f} takes {step.step_s(1, ctx) * 1000:.1f} ms per token, over the "
            f"TPOT objective of {target_s * 1000:.1f} ms (or its KV does not fit)",
        )
    speed = 1.0 / step.step_s(b_max, ctx)
    residence_s = model.transfer_s + out / speed
    counts = barriers.barrier_counts(
        barriers.throughput_gpus(lam, out, b_max * speed),
        barriers.latency_gpus(lam * out / speed, b_max),
        barriers.memory_gpus(lam * residence_s, workload.context_tokens, kv_tok, budget),
    )

    def meets(replicas: int) -> bool:
        latency = decode_pool_latency(model, replicas)
        return (
            latency is not None
            and latency.tpot_p95_s <= target_s
            and latency.streams_p95_per_replica <= b_max
        )

    n_base = _first_replicas(meets, counts.n_base, "slo", "decode")
    binding = "tpot" if n_base > counts.n_base else str(counts.binding)
    n = barriers.replicas_with_headroom(n_base, inputs.headroom.ratio, inputs.headroom.min_replicas)
    return DecodePool(
        context_tokens=ctx,
        step_fixed_s=step.fixed_s,
        kv_token_s=step.kv_token_s,
        tpot_max_s=target_s,
        kv_limit_streams=model.kv_limit_streams,
        b_max=b_max,
        stream_tokens_per_s=speed,
        decode_tokens_per_s=b_max * speed,
        kv_residence_s=residence_s,
        counts=counts,
        n_base=n_base,
        binding=binding,
        n_replicas=n,
    )


def plan_prefill(
    inputs: PlanInputs, disagg: DisaggInputs, model: PoolModel, decode_replicas: int
) -> PrefillPool:
    """The prefill pool of the module docstring, in front of `decode_replicas` decode replicas."""
    floor_s = model.prefill_s + model.transfer_s + model.step.fixed_s
    if floor_s > disagg.ttft_p95_s:
        raise InfeasibleError(
            "disaggregation.ttft_p95_s",
            f"prefill {model.prefill_s:.3f} s + transfer {model.transfer_s:.3f} s + first step "
            f"{model.step.fixed_s:.3f} s = {floor_s:.3f} s exceed the TTFT SLO before any queueing: a faster "
            "link or prefill GPU is needed",
        )
    decode = decode_pool_latency(model, decode_replicas)
    assert decode is not None
    alone = PrefillLatency(0.0, model.prefill_s, model.prefill_s)
    if combine(model, alone, decode)[2] > disagg.ttft_p95_s:
        raise InfeasibleError(
            "disaggregation.ttft_p95_s",
            f"prefill {model.prefill_s:.3f} s and the first decode token "
            f"{combine(model, alone, decode)[0]:.3f} s exceed the TTFT SLO even without a prefill queue",
        )
    key = "disaggregation.ttft_p95_s"
    n_compute = _first_replicas(lambda c: prefill_latency(model, c) is not None, 1, key, "prefill")

    def meets(replicas: int) -> bool:
        prefill = prefill_latency(model, replicas)
        return prefill is not None and combine(model, prefill, decode)[2] <= disagg.ttft_p95_s

    n_base = _first_replicas(meets, n_compute, key, "prefill")
    one = prefill_latency(model, n_base)
    assert one is not None
    return PrefillPool(
        prefill_s=model.prefill_s,
        batched=model.batched_prefill,
        transfer_s=model.transfer_s,
        busy_gpus=one.utilisation_ratio * n_base,
        n_compute=n_compute,
        n_base=n_base,
        binding="ttft" if n_base > n_compute else "compute",
        n_replicas=barriers.replicas_with_headroom(
            n_base, inputs.headroom.ratio, inputs.headroom.min_replicas
        ),
    )


def workload_model(inputs: PlanInputs, workload: Workload) -> tuple[PoolModel, float, float]:
    """The `PoolModel` of a workload, with kv_tok and M_KV (bytes)."""
    disagg, model, gpu = inputs.disaggregation, inputs.model, inputs.gpu
    if disagg is None:
        raise InfeasibleError("disaggregation", "the input has no disaggregation section")
    kv_tok = memory.kv_bytes_per_token(
        model.n_layers, model.n_kv_heads, model.head_dim, model.kv_bytes_per_element
    )
    weights = memory.weights_bytes(model.parameters, model.weight_bytes_per_parameter)
    budget = memory.kv_budget_bytes(gpu.memory_bytes, weights, gpu.overhead_bytes)
    if budget <= 0:
        raise InfeasibleError("gpu.memory_gb", "weights and overhead leave no KV budget on a decode GPU")
    ctx = workload.mean_input_tokens + workload.mean_output_tokens / 2
    step: DecodeStepModel = fit_decode_step(inputs.throughput, weights, gpu.bandwidth_bytes_per_s, ctx)
    link_s = transfer_s(workload.mean_input_tokens, kv_tok, disagg.link_bytes_per_s, disagg.link_latency_s)
    pool = pool_model(
        arrival_rate_per_s=workload.arrival_rate_per_s,
        input_tokens=workload.mean_input_tokens,
        output_tokens=workload.mean_output_tokens,
        step=step,
        prefill_tokens_per_s=disagg.prefill_tokens_per_s,
        chunk_tokens=disagg.prefill_chunk_tokens,
        transfer_s=link_s,
        kv_capacity_tokens=memory.kv_capacity_tokens(budget, kv_tok),
    )
    return pool, kv_tok, budget


def _pools(inputs: PlanInputs, workload: Workload) -> tuple[PrefillPool, DecodePool, PoolModel]:
    disagg = inputs.disaggregation
    assert disagg is not None
    model, kv_tok, budget = workload_model(inputs, workload)
    decode = plan_decode(inputs, workload, model, kv_tok, budget)
    return plan_prefill(inputs, disagg, model, decode.n_base), decode, model


def build_disagg_plan(inputs: PlanInputs, aggregated_n_base: int | None = None) -> DisaggPlan:
    """Both pools for the input workload, their predicted latencies, and the N_p : N_d table."""
    disagg = inputs.disaggregation
    if disagg is None:
        raise InfeasibleError("disaggregation", "the input has no disaggregation section")
    prefill, decode, model = _pools(inputs, inputs.workload)
    at_base = pool_latency(model, prefill.n_base, decode.n_base)
    at_headroom = pool_latency(model, prefill.n_replicas, decode.n_replicas)
    assert at_base is not None and at_headroom is not None
    cells = []
    for input_tokens in disagg.table_input_tokens:
        for output_tokens in disagg.table_output_tokens:
            workload = dataclasses.replace(
                inputs.workload, mean_input_tokens=input_tokens, mean_output_tokens=output_tokens
            )
            try:
                p, d, _ = _pools(inputs, workload)
                cells.append(RatioCell(input_tokens, output_tokens, p.n_base, d.n_base))
            except InfeasibleError:
                cells.append(RatioCell(input_tokens, output_tokens, None, None))
    return DisaggPlan(
        prefill, decode, prefill.n_base / decode.n_base, at_base, at_headroom, aggregated_n_base, tuple(cells)
    )
