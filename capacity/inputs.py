"""Frozen inputs of a capacity plan: model, GPU, measured throughput table, workload, SLO, headroom.

All sizes are in bytes and all rates per second inside the planner; the YAML file uses GB (10^9 bytes,
as GPU vendors count HBM) and milliseconds where that reads better, and the loader converts them.
These are plain values: validation with key-naming errors lives in `capacity.loader`.
"""

from __future__ import annotations

from dataclasses import dataclass

GB_BYTES = 1_000_000_000
"""One GB as GPU memory is specified (decimal): 80 GB HBM = 80 * 10^9 bytes."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The model's shape: what its KV cache and weights cost in memory.

    `kv_bytes_per_element` is the KV-cache element size (2 for FP16/BF16, 1 for FP8);
    `weight_bytes_per_parameter` the weight element size (may differ under weight quantisation).
    """

    name: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    parameters: float
    kv_bytes_per_element: float
    weight_bytes_per_parameter: float


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU (one replica): HBM, the runtime overhead allowance, bandwidth and price.

    `overhead_bytes` covers activations, CUDA graphs, the framework and fragmentation — what is
    neither weights nor KV cache. `bandwidth_bytes_per_s` is optional and only feeds the decode
    roofline sanity check.
    """

    name: str
    memory_bytes: float
    overhead_bytes: float
    usd_per_hour: float
    bandwidth_bytes_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """One measured row: at `batch` concurrent streams, each stream decodes `stream_tokens_per_s`
    and the replica as a whole `aggregate_tokens_per_s` (normally batch * per-stream).
    `ttft_p95_s` is the TTFT p95 measured at that batch, needed only for a TTFT SLO."""

    batch: int
    stream_tokens_per_s: float
    aggregate_tokens_per_s: float
    ttft_p95_s: float | None = None


@dataclass(frozen=True, slots=True)
class ThroughputTable:
    """A load test's result for one replica: rows sorted by batch, the context length they were
    measured at, and the mean time to first token under load (used for W)."""

    points: tuple[ThroughputPoint, ...]
    ttft_mean_s: float
    context_tokens: int | None = None

    def at_batch(self, batch: int) -> ThroughputPoint:
        """The measured row for `batch`; `KeyError` when that batch was not measured."""
        for point in self.points:
            if point.batch == batch:
                return point
        raise KeyError(batch)


@dataclass(frozen=True, slots=True)
class Workload:
    """Offered load: λ requests per second with mean input ī and mean output ō tokens."""

    arrival_rate_per_s: float
    mean_input_tokens: float
    mean_output_tokens: float

    @property
    def context_tokens(self) -> float:
        """ctx = ī + ō: the KV a request holds when it finishes (its peak footprint)."""
        return self.mean_input_tokens + self.mean_output_tokens


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency objectives; any combination, at least one. A batch meets the SLO when it meets all.

    `tpot_max_s` (time per output token) and `min_stream_tokens_per_s` both bound per-stream decode
    speed; `e2e_p95_s` bounds TTFT + ō / speed; `ttft_p95_s` bounds the TTFT p95 measured at a batch.
    """

    tpot_max_s: float | None = None
    min_stream_tokens_per_s: float | None = None
    e2e_p95_s: float | None = None
    ttft_p95_s: float | None = None


@dataclass(frozen=True, slots=True)
class Headroom:
    """r: spare capacity above the binding barrier; never fewer than `min_replicas` replicas."""

    ratio: float
    min_replicas: int = 1


@dataclass(frozen=True, slots=True)
class Spike:
    """A k-fold step in arrivals that lasts at least one cold start, and the utilisation to plan it at."""

    factor: float
    cold_start_s: float
    target_utilisation_ratio: float


@dataclass(frozen=True, slots=True)
class CostInputs:
    """What to compare the operating cost with: a smaller batch (a measured row; None = the smallest
    measured) and the fraction of capacity that does useful work."""

    compare_batch: int | None
    useful_load_ratio: float


@dataclass(frozen=True, slots=True)
class DisaggInputs:
    """A disaggregated pool: prefill GPUs at the compute roof, the KV link, and the TTFT objective.

    `prefill_tokens_per_s` is one prefill GPU's prompt throughput at its compute roof (measured, or
    2 · parameters FLOP per token at the achieved FLOP/s); `ttft_p95_s` bounds queue + prefill + KV
    transfer + the first decode step; the ratio table is computed at these input and output lengths.
    `prefill_chunk_tokens` is the prefill engine's token budget per step (vLLM's
    `max_num_batched_tokens`; None: no budget): a prompt longer than it takes several steps, and a
    budget of two prompts or more lets waiting prompts share a step.
    """

    prefill_tokens_per_s: float
    link_bytes_per_s: float
    ttft_p95_s: float
    link_latency_s: float = 0.0
    prefill_chunk_tokens: int | None = 8192
    table_input_tokens: tuple[int, ...] = (256, 1024, 4096, 8192)
    table_output_tokens: tuple[int, ...] = (64, 256, 1024)


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything one plan needs; `disaggregation` None plans an aggregated pool only."""

    model: ModelSpec
    gpu: GpuSpec
    throughput: ThroughputTable
    workload: Workload
    slo: Slo
    headroom: Headroom
    spike: Spike
    cost: CostInputs
    disaggregation: DisaggInputs | None = None
