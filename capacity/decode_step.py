"""One engine step (forward pass) of a replica as a line in the KV it reads: the decode step model.

Decoding is memory-bound: every step reads the weights once and the KV of every running sequence,

    step(B, ctx) = t_w + B · ctx · t_kv          seconds; per-stream speed v = 1 / step

t_w is the fixed cost of a step and t_kv the cost of one context token's KV in one step. A measured
throughput table gives step = 1 / v at a few batches, all at one context (`throughput.context_tokens`),
so the table alone cannot say how a step grows with context; the line can, which is what a workload
with much longer contexts than the table's needs (8,448 tokens against 800: each stream then costs
ten times the table's KV read per step).

Fit (x_i = B_i · ctx_table, y_i = 1 / v_i over the rows):

- with `gpu.bandwidth_gb_per_s`: t_w = weights / bandwidth (the roofline's weight read) and
  t_kv = Σ x_i (y_i − t_w) / Σ x_i², least squares through that intercept;
- without it: the least-squares line through the rows (at least two distinct batches), t_w ≥ 0.

A table without `context_tokens` is taken as measured at the workload's context, so the line reproduces
the table there. `InfeasibleError` (keyed `throughput.points`) when the fit gives t_kv ≤ 0 (speeds that
do not fall with the batch) and, without a bandwidth, when fewer than two batches were measured.
`max_batch` is the largest measured batch: the line is not trusted beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.errors import InfeasibleError
from capacity.inputs import ThroughputTable


@dataclass(frozen=True, slots=True)
class DecodeStepModel:
    """step(B, ctx) = fixed_s + B · ctx · kv_token_s, trusted up to `max_batch` streams."""

    fixed_s: float
    kv_token_s: float
    max_batch: int

    def step_s(self, batch: float, context_tokens: float) -> float:
        """t_w + B · ctx · t_kv."""
        return self.fixed_s + batch * context_tokens * self.kv_token_s

    def largest_batch_within(self, step_max_s: float, context_tokens: float) -> int:
        """The largest whole B with step(B, ctx) ≤ step_max_s, capped at `max_batch`; 0 if none."""
        room_s = step_max_s - self.fixed_s
        if room_s <= 0:
            return 0
        return min(self.max_batch, int(room_s / (context_tokens * self.kv_token_s) + 1e-9))


def fit_decode_step(
    table: ThroughputTable,
    weights_bytes: float,
    bandwidth_bytes_per_s: float | None,
    workload_context_tokens: float,
) -> DecodeStepModel:
    """The line of the module docstring through the table's rows."""
    ctx = table.context_tokens if table.context_tokens is not None else workload_context_tokens
    xs = [point.batch * ctx for point in table.points]
    ys = [1.0 / point.stream_tokens_per_s for point in table.points]
    max_batch = max(point.batch for point in table.points)
    if bandwidth_bytes_per_s is not None:
        fixed_s = weights_bytes / bandwidth_bytes_per_s
        slope = sum(x * (y - fixed_s) for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    else:
        if len(set(xs)) < 2:
            raise InfeasibleError(
                "throughput.points",
                "splitting a decode step into weight and KV reads needs gpu.bandwidth_gb_per_s "
                "or rows at two batches at least",
            )
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mean_x) ** 2 for x in xs
        )
        fixed_s = max(0.0, mean_y - slope * mean_x)
    if slope <= 0:
        raise InfeasibleError(
            "throughput.points",
            "per-stream speed does not fall with the batch: the rows cannot size a decode pool",
        )
    return DecodeStepModel(fixed_s, slope, max_batch)
