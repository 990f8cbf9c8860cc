"""Compose the pure formulas into one plan: `build_plan(inputs) -> Plan`.

Each section of `Plan` (see `capacity.results`) is a frozen dataclass with units in the names; the
formulas are documented in the module that computes them (`memory`, `batch`, `barriers`, `queueing`,
`spike`, `cost`). `notes` carries plain-language warnings an operator should read before trusting the numbers.
"""

from __future__ import annotations

from capacity import barriers, cost, memory, queueing, spike
from capacity.batch import select_b_max
from capacity.errors import InfeasibleError
from capacity.inputs import PlanInputs
from capacity.results import (
    CostPlan,
    MemoryPlan,
    OperatingPoint,
    Plan,
    ReplicaPlan,
    SpikePlan,
    UtilisationPlan,
)

_CONTEXT_MISMATCH_RATIO = 0.25


def plan_memory(inputs: PlanInputs) -> MemoryPlan:
    """kv_tok, weights and the KV budget of one replica; `InfeasibleError` if the weights do not fit."""
    model, gpu = inputs.model, inputs.gpu
    kv_tok = memory.kv_bytes_per_token(
        model.n_layers, model.n_kv_heads, model.head_dim, model.kv_bytes_per_element
    )
    weights = memory.weights_bytes(model.parameters, model.weight_bytes_per_parameter)
    budget = memory.kv_budget_bytes(gpu.memory_bytes, weights, gpu.overhead_bytes)
    if budget <= 0:
        raise InfeasibleError(
            "gpu.memory_gb",
            f"weights ({weights / 1e9:.1f} GB) + overhead ({gpu.overhead_bytes / 1e9:.1f} GB) leave no KV "
            "budget; use a larger GPU, a smaller overhead or tensor parallelism (not modelled)",
        )
    capacity_tokens = memory.kv_capacity_tokens(budget, kv_tok)
    ctx = inputs.workload.context_tokens
    resident = memory.kv_resident_requests(capacity_tokens, ctx)
    return MemoryPlan(kv_tok, weights, budget, capacity_tokens, ctx, resident)


def plan_operating_point(inputs: PlanInputs, mem: MemoryPlan) -> OperatingPoint:
    """B_max from the SLO, then W = TTFT_mean + ō / v(B_max) and L = λ · W."""
    workload, table = inputs.workload, inputs.throughput
    choice = select_b_max(table, inputs.slo, workload.mean_output_tokens)
    if choice is None:
        raise InfeasibleError("slo", "no measured batch meets the SLO; relax it or measure smaller batches")
    point = choice.point
    roofline = efficiency = None
    if inputs.gpu.bandwidth_bytes_per_s is not None:
        roofline = memory.decode_roofline_stream_tokens_per_s(
            mem.weights_bytes,
            mem.kv_bytes_per_token,
            point.batch,
            mem.context_tokens,
            inputs.gpu.bandwidth_bytes_per_s,
        )
        efficiency = point.stream_tokens_per_s / roofline
    w_s = barriers.time_in_system_s(table.ttft_mean_s, workload.mean_output_tokens, point.stream_tokens_per_s)
    return OperatingPoint(
        b_max=point.batch,
        limited_by=choice.limited_by,
        required_stream_tokens_per_s=choice.required_stream_tokens_per_s,
        stream_tokens_per_s=point.stream_tokens_per_s,
        decode_tokens_per_s=point.aggregate_tokens_per_s,
        roofline_stream_tokens_per_s=roofline,
        roofline_efficiency_ratio=efficiency,
        ttft_mean_s=table.ttft_mean_s,
        time_in_system_s=w_s,
        concurrency_requests=barriers.littles_law_requests(workload.arrival_rate_per_s, w_s),
    )


def plan_replicas(inputs: PlanInputs, mem: MemoryPlan, op: OperatingPoint) -> ReplicaPlan:
    """Each barrier's GPU count, the binding one, N_base and N = ⌈N_base · (1 + r)⌉."""
    workload = inputs.workload
    counts = barriers.barrier_counts(
        barriers.throughput_gpus(
            workload.arrival_rate_per_s, workload.mean_output_tokens, op.decode_tokens_per_s
        ),
        barriers.latency_gpus(op.concurrency_requests, op.b_max),
        barriers.memory_gpus(
            op.concurrency_requests, mem.context_tokens, mem.kv_bytes_per_token, mem.kv_budget_bytes
        ),
    )
    n = barriers.replicas_with_headroom(counts.n_base, inputs.headroom.ratio, inputs.headroom.min_replicas)
    return ReplicaPlan(
        counts.throughput_gpus,
        counts.latency_gpus,
        counts.memory_gpus,
        counts.n_throughput,
        counts.n_latency,
        counts.n_memory,
        counts.binding,
        counts.n_base,
        inputs.headroom.ratio,
        n,
    )


def plan_utilisation(inputs: PlanInputs, op: OperatingPoint, reps: ReplicaPlan) -> UtilisationPlan:
    """rho at N_base, N and N - 1, occupancy L / (N · B_max), and M/M/1, M/M/c (c = replicas) multipliers."""
    workload = inputs.workload

    def rho(n: int) -> float:
        return queueing.utilisation_ratio(
            workload.arrival_rate_per_s, workload.mean_output_tokens, n, op.decode_tokens_per_s
        )

    n, lost = reps.n_replicas, reps.n_replicas - 1
    return UtilisationPlan(
        at_base_ratio=rho(reps.n_base),
        at_n_ratio=rho(n),
        one_lost_ratio=rho(lost),
        occupancy_ratio=queueing.occupancy_ratio(op.concurrency_requests, n, op.b_max),
        mm1_multiplier_ratio=queueing.mm1_time_multiplier_ratio(rho(n)),
        mmc_multiplier_ratio=queueing.mmc_time_multiplier_ratio(n, rho(n)),
        one_lost_mm1_multiplier_ratio=queueing.mm1_time_multiplier_ratio(rho(lost)),
        one_lost_mmc_multiplier_ratio=queueing.mmc_time_multiplier_ratio(lost, rho(lost)),
    )


def plan_spike(inputs: PlanInputs, op: OperatingPoint, reps: ReplicaPlan) -> SpikePlan:
    """Backlog of a k-fold spike on N replicas during one cold start, and N_spike at rho_target."""
    workload, sp = inputs.workload, inputs.spike
    demand = spike.spike_demand_tokens_per_s(
        sp.factor, workload.arrival_rate_per_s, workload.mean_output_tokens
    )
    capacity = reps.n_replicas * op.decode_tokens_per_s
    backlog = spike.cold_start_backlog_tokens(demand, capacity, sp.cold_start_s)
    n_spike = spike.replicas_for_load(demand, op.decode_tokens_per_s, sp.target_utilisation_ratio)
    drain = spike.backlog_drain_s(backlog, n_spike * op.decode_tokens_per_s, demand)
    return SpikePlan(
        sp.factor,
        sp.cold_start_s,
        demand,
        capacity,
        backlog,
        backlog / workload.mean_output_tokens,
        sp.target_utilisation_ratio,
        n_spike,
        drain,
    )


def plan_cost(inputs: PlanInputs, op: OperatingPoint, reps: ReplicaPlan) -> CostPlan:
    """Cost per 10^6 tokens at B_max, at the comparison batch, at the useful-load fraction, and fleet-wide."""
    price, table = inputs.gpu.usd_per_hour, inputs.throughput
    batch = inputs.cost.compare_batch
    if batch is None:
        batch = min(p.batch for p in table.points)
    try:
        compare_point = table.at_batch(batch)
    except KeyError:
        raise InfeasibleError(
            "cost.compare_batch", f"batch {batch} is not a measured throughput row"
        ) from None
    operating = cost.usd_per_million_tokens(price, op.decode_tokens_per_s)
    served = inputs.workload.arrival_rate_per_s * inputs.workload.mean_output_tokens
    fleet_price = reps.n_replicas * price
    return CostPlan(
        usd_per_gpu_hour=price,
        operating_usd_per_million_tokens=operating,
        compare_batch=batch,
        compare_usd_per_million_tokens=cost.usd_per_million_tokens(
            price, compare_point.aggregate_tokens_per_s
        ),
        useful_load_ratio=inputs.cost.useful_load_ratio,
        useful_load_usd_per_million_tokens=cost.useful_load_usd_per_million_tokens(
            operating, inputs.cost.useful_load_ratio
        ),
        fleet_usd_per_hour=fleet_price,
        fleet_usd_per_million_tokens=cost.usd_per_million_tokens(fleet_price, served),
    )


def plan_notes(inputs: PlanInputs, op: OperatingPoint, util: UtilisationPlan) -> tuple[str, ...]:
    """Warnings: B_max at the table's edge, a table measured at another context, inputs above the
    roofline, a pool that one lost replica overloads."""
    notes: list[str] = []
    if op.limited_by is None:
        notes.append(
            f"B_max = {op.b_max} is the largest measured batch; measure larger batches to find the limit"
        )
    table_ctx, ctx = inputs.throughput.context_tokens, inputs.workload.context_tokens
    if table_ctx is not None and abs(table_ctx - ctx) > _CONTEXT_MISMATCH_RATIO * ctx:
        notes.append(f"throughput table measured at ctx {table_ctx} tokens, workload context is {ctx:.0f}")
    if op.roofline_efficiency_ratio is not None and op.roofline_efficiency_ratio > 1:
        notes.append("measured decode speed exceeds the bandwidth roofline: check the GPU and model inputs")
    if util.one_lost_ratio >= 1:
        notes.append("losing one replica overloads the pool (rho ≥ 1 at N - 1): add headroom")
    return tuple(notes)


def build_plan(inputs: PlanInputs) -> Plan:
    """The full plan; raises `InfeasibleError` (naming the key) when the inputs cannot be planned."""
    if inputs.workload.mean_output_tokens <= 0:
        raise InfeasibleError("workload.mean_output_tokens", "must be > 0")
    mem = plan_memory(inputs)
    op = plan_operating_point(inputs, mem)
    reps = plan_replicas(inputs, mem, op)
    util = plan_utilisation(inputs, op, reps)
    return Plan(
        memory=mem,
        operating=op,
        replicas=reps,
        utilisation=util,
        spike=plan_spike(inputs, op, reps),
        cost=plan_cost(inputs, op, reps),
        notes=plan_notes(inputs, op, util),
    )
