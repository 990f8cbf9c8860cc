"""What the live autoscaling signal is tuned with: the pool's capacity model and the controller settings.

`PoolCapacity` is the per-replica model the planner uses — B_max (the latency barrier's cap, the
gateway's `max_concurrency_per_replica`) and T_dec (aggregate decode tok/s at B_max, from a measured
throughput table or the mock engine's profile) — plus the latency SLO the safety net checks.
`AutoscaleSettings` holds the windows, the hysteresis thresholds and the bounds, with the defaults
documented field by field. `ScaleReason` is the label that says what set the desired count.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from capacity.batch import select_b_max
from capacity.errors import InfeasibleError
from capacity.inputs import Slo, ThroughputTable
from capacity.results import Plan


class ScaleReason(StrEnum):
    """What sets the desired replica count (exported as the `reason` label)."""

    THROUGHPUT = "throughput"
    """λ·ō / T_dec: output tokens demanded over what a replica decodes."""
    LATENCY = "latency"
    """L / B_max: concurrent streams (Little's law or the engines' batches) over the SLO-safe batch."""
    QUEUE = "queue"
    """Queue pressure: the recent arrival rate, or one more than the ready replicas for a growing queue."""
    SLO_TTFT = "slo_ttft"
    """Safety net: measured TTFT p95 (net of queue wait) above the SLO: one more than the ready replicas."""
    SLO_TPOT = "slo_tpot"
    """Safety net: measured TPOT p95 above the SLO: one more than the ready replicas."""
    MINIMUM = "minimum"
    """The configured floor (`min_replicas`)."""
    MAXIMUM = "maximum"
    """The configured ceiling (`max_replicas`) cut the demand."""
    COOLDOWN = "cooldown"
    """The demand is lower, but the scale-down cooldown has not run out yet (hysteresis)."""


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """One replica as the barrier model sees it, and the SLO the p95 safety net checks.

    `b_max`: the largest batch that meets the SLO (streams per replica); `decode_tokens_per_s`: T_dec,
    the aggregate decode rate at `b_max`; `ttft_p95_slo_s` / `tpot_p95_slo_s`: optional latency
    objectives (None disables that safety net).
    """

    b_max: int
    decode_tokens_per_s: float
    ttft_p95_slo_s: float | None = None
    tpot_p95_slo_s: float | None = None

    def __post_init__(self) -> None:
        if self.b_max < 1:
            raise ValueError("b_max must be >= 1")
        if self.decode_tokens_per_s <= 0:
            raise ValueError("decode_tokens_per_s must be > 0")
        for name in ("ttft_p95_slo_s", "tpot_p95_slo_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0")

    @classmethod
    def from_table(cls, table: ThroughputTable, slo: Slo, mean_output_tokens: float) -> PoolCapacity:
        """B_max and T_dec from a measured table exactly as the planner chooses them (`select_b_max`);
        the SLO's TTFT p95 and TPOT bound (the tighter of TPOT_max and 1 / minimum stream speed) become the
        safety net. `InfeasibleError` if no row meets it."""
        choice = select_b_max(table, slo, mean_output_tokens)
        if choice is None:
            raise InfeasibleError(
                "slo", "no measured batch meets the SLO; relax it or measure smaller batches"
            )
        point = choice.point
        return cls(point.batch, point.aggregate_tokens_per_s, slo.ttft_p95_s, _tpot_bound_s(slo))

    @classmethod
    def from_plan(cls, plan: Plan, slo: Slo) -> PoolCapacity:
        """The operating point of an offline plan (its B_max and T_dec) with the same SLO."""
        op = plan.operating
        return cls(op.b_max, op.decode_tokens_per_s, slo.ttft_p95_s, _tpot_bound_s(slo))


def _tpot_bound_s(slo: Slo) -> float | None:
    """The TPOT the SLO allows: the tighter of TPOT_max and 1 / the minimum per-stream speed."""
    bounds = [] if slo.tpot_max_s is None else [slo.tpot_max_s]
    if slo.min_stream_tokens_per_s is not None:
        bounds.append(1.0 / slo.min_stream_tokens_per_s)
    return min(bounds) if bounds else None


@dataclass(frozen=True, slots=True)
class AutoscaleSettings:
    """Windows, hysteresis and bounds of the autoscaling signal (defaults in brackets).

    - `window_s` [60]: averaging window for λ, ō, W and the latency p95s.
    - `evaluation_period_s` [15]: how often the gateway evaluates, and the recent window of the leading
      signals (λ_recent, engine batches, queue depth, queue wait). Scale-up happens at the first
      evaluation that sees the new load: within one period.
    - `scale_up_utilisation_ratio` ρ_up [0.8]: target utilisation; up-target = ⌈D / ρ_up⌉.
    - `scale_down_utilisation_ratio` ρ_down [0.6]: down-target = ⌈D / ρ_down⌉; scale down only while it
      is below the current count, i.e. while even one replica fewer would run at or below ρ_down.
    - `scale_down_cooldown_s` [300]: the down-target must stay below the current count this long.
    - `scale_down_step_replicas` [None]: None = go straight to the down-target; k = at most k replicas
      per step (each step then needs its own cooldown).
    - `min_replicas` [1]: never fewer (1 = no scale to zero for latency-critical pools; 0 allowed).
    - `max_replicas` [None]: optional ceiling.
    - `queue_depth_threshold` [1]: a standing queue is a minimum depth over the recent window ≥ this.
    - `queue_wait_threshold_s` [1.0]: queue pressure when the recent p95 admission wait is ≥ this.
    - `min_latency_samples` [20]: the p95 safety nets need at least this many samples.
    - `replica_stale_s` [30]: a replica without an engine sample for this long is not ready.
    - `bucket_s` [1], `max_samples` [10,000]: window resolution and the bound on kept latency samples.
    """

    window_s: float = 60.0
    evaluation_period_s: float = 15.0
    scale_up_utilisation_ratio: float = 0.8
    scale_down_utilisation_ratio: float = 0.6
    scale_down_cooldown_s: float = 300.0
    scale_down_step_replicas: int | None = None
    min_replicas: int = 1
    max_replicas: int | None = None
    queue_depth_threshold: int = 1
    queue_wait_threshold_s: float = 1.0
    min_latency_samples: int = 20
    replica_stale_s: float = 30.0
    bucket_s: float = 1.0
    max_samples: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.evaluation_period_s <= self.window_s:
            raise ValueError("need 0 < evaluation_period_s <= window_s")
        if not 0 < self.scale_down_utilisation_ratio < self.scale_up_utilisation_ratio <= 1:
            raise ValueError("need 0 < scale_down_utilisation_ratio < scale_up_utilisation_ratio <= 1")
        if self.scale_down_cooldown_s < 0:
            raise ValueError("scale_down_cooldown_s must be >= 0")
        if self.scale_down_step_replicas is not None and self.scale_down_step_replicas < 1:
            raise ValueError("scale_down_step_replicas must be >= 1 (or None)")
        if self.min_replicas < 0:
            raise ValueError("min_replicas must be >= 0")
        if self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas):
            raise ValueError("max_replicas must be >= max(1, min_replicas)")
        if self.queue_depth_threshold < 1 or self.queue_wait_threshold_s <= 0:
            raise ValueError("queue_depth_threshold must be >= 1 and queue_wait_threshold_s > 0")
        if self.min_latency_samples < 1 or self.max_samples < 1:
            raise ValueError("min_latency_samples and max_samples must be >= 1")
        if self.replica_stale_s <= 0 or self.bucket_s <= 0:
            raise ValueError("replica_stale_s and bucket_s must be > 0")

    def clamp(self, replicas: int) -> int:
        """`replicas` within [min_replicas, max_replicas]."""
        replicas = max(self.min_replicas, replicas)
        return replicas if self.max_replicas is None else min(self.max_replicas, replicas)
