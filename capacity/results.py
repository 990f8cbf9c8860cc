"""Frozen outputs of a capacity plan, one dataclass per section; units in every field name.

`Plan` is what `capacity.plan.build_plan` returns and what `capacity.report` renders (as a table or,
field for field, as JSON). Ratios are dimensionless; `math.inf` marks an unstable queue or a fleet
with no spare capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.barriers import Barrier
from capacity.batch import SloTerm


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per replica: kv_tok, weights, M_KV, KV tokens, and how many whole contexts fit."""

    kv_bytes_per_token: float
    weights_bytes: float
    kv_budget_bytes: float
    kv_capacity_tokens: int
    context_tokens: float
    kv_resident_requests: float


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """B_max and the rates there; W and L by Little's law; the bandwidth roofline when known."""

    b_max: int
    limited_by: SloTerm | None
    required_stream_tokens_per_s: float | None
    stream_tokens_per_s: float
    decode_tokens_per_s: float
    roofline_stream_tokens_per_s: float | None
    roofline_efficiency_ratio: float | None
    ttft_mean_s: float
    time_in_system_s: float
    concurrency_requests: float


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """The three barriers, which binds, N_base and N with headroom r."""

    throughput_gpus: float
    latency_gpus: float
    memory_gpus: float
    n_throughput: int
    n_latency: int
    n_memory: int
    binding: Barrier
    n_base: int
    headroom_ratio: float
    n_replicas: int


@dataclass(frozen=True, slots=True)
class UtilisationPlan:
    """rho at N_base, at N and at N - 1 (one replica lost), batch occupancy, and the queueing multipliers."""

    at_base_ratio: float
    at_n_ratio: float
    one_lost_ratio: float
    occupancy_ratio: float
    mm1_multiplier_ratio: float
    mmc_multiplier_ratio: float
    one_lost_mm1_multiplier_ratio: float
    one_lost_mmc_multiplier_ratio: float


@dataclass(frozen=True, slots=True)
class SpikePlan:
    """A k-fold spike on N replicas during one cold start: backlog, replicas to carry it, drain time."""

    factor: float
    cold_start_s: float
    demand_tokens_per_s: float
    capacity_tokens_per_s: float
    backlog_tokens: float
    backlog_requests: float
    target_utilisation_ratio: float
    n_replicas: int
    drain_s: float


@dataclass(frozen=True, slots=True)
class CostPlan:
    """Cost per million output tokens at B_max, at a smaller batch, at a useful-load fraction, and for
    the planned fleet at the offered load (headroom included)."""

    usd_per_gpu_hour: float
    operating_usd_per_million_tokens: float
    compare_batch: int
    compare_usd_per_million_tokens: float
    useful_load_ratio: float
    useful_load_usd_per_million_tokens: float
    fleet_usd_per_hour: float
    fleet_usd_per_million_tokens: float


@dataclass(frozen=True, slots=True)
class Plan:
    """The whole answer to "how many GPUs?", section by section."""

    memory: MemoryPlan
    operating: OperatingPoint
    replicas: ReplicaPlan
    utilisation: UtilisationPlan
    spike: SpikePlan
    cost: CostPlan
    notes: tuple[str, ...]
