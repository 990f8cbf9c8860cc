"""B_max: the largest measured batch that still meets the latency SLO (the latency barrier's cap).

Continuous batching trades per-stream speed for aggregate throughput: the more streams share a
decode step, the more tokens per second the replica produces and the fewer each stream gets. The SLO
fixes how slow a stream may get, and the measured throughput table says at which batch that happens.

Worked example: TPOT ≤ 16.7 ms ⇒ per stream ≥ 1 / 0.0167 ≈ 59.9 tok/s. Measured: 16 → 105 tok/s,
64 → 68 tok/s, 128 → 44 tok/s, so B_max = 64 (68 tok/s per stream, T_dec = 4,352 tok/s aggregate),
limited by TPOT (batch 128 is too slow). Only measured rows are candidates — no interpolation between
rows, because the curve between them is not known; measure more batches for a finer answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from capacity.inputs import Slo, ThroughputPoint, ThroughputTable


class SloTerm(StrEnum):
    """Which SLO term stops a batch (a label: which objective limits B_max)."""

    TPOT = "tpot"
    STREAM_SPEED = "stream_speed"
    E2E = "e2e"
    TTFT = "ttft"


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """The operating point: the chosen row, and which SLO term the next larger measured batch breaks.

    `limited_by` is None when even the largest measured batch meets the SLO: B_max is then a lower
    bound and a load test at larger batches may allow more.
    """

    point: ThroughputPoint
    limited_by: SloTerm | None
    required_stream_tokens_per_s: float | None


def required_stream_tokens_per_s(slo: Slo) -> float | None:
    """The per-stream decode speed the speed terms demand: max(1 / TPOT_max, min speed); None if neither."""
    floors = []
    if slo.tpot_max_s is not None:
        floors.append(1.0 / slo.tpot_max_s)
    if slo.min_stream_tokens_per_s is not None:
        floors.append(slo.min_stream_tokens_per_s)
    return max(floors) if floors else None


def e2e_estimate_s(ttft_s: float, mean_output_tokens: float, stream_tokens_per_s: float) -> float:
    """End-to-end time of a mean request at a batch: TTFT + ō / per-stream speed.

    An approximation of the p95: it uses the mean output length; the TTFT is the row's measured p95
    when the table has one, else the table's mean TTFT.
    """
    return ttft_s + mean_output_tokens / stream_tokens_per_s


def violated_terms(
    point: ThroughputPoint, slo: Slo, mean_output_tokens: float, ttft_mean_s: float
) -> list[SloTerm]:
    """The SLO terms `point` breaks (empty when it meets the SLO)."""
    broken: list[SloTerm] = []
    speed = point.stream_tokens_per_s
    if slo.tpot_max_s is not None and speed < 1.0 / slo.tpot_max_s:
        broken.append(SloTerm.TPOT)
    if slo.min_stream_tokens_per_s is not None and speed < slo.min_stream_tokens_per_s:
        broken.append(SloTerm.STREAM_SPEED)
    ttft_s = point.ttft_p95_s if point.ttft_p95_s is not None else ttft_mean_s
    if slo.e2e_p95_s is not None and e2e_estimate_s(ttft_s, mean_output_tokens, speed) > slo.e2e_p95_s:
        broken.append(SloTerm.E2E)
    if slo.ttft_p95_s is not None:
        if point.ttft_p95_s is None:
            raise ValueError(f"batch {point.batch} has no measured ttft_p95_s but the SLO bounds TTFT")
        if point.ttft_p95_s > slo.ttft_p95_s:
            broken.append(SloTerm.TTFT)
    return broken


def select_b_max(table: ThroughputTable, slo: Slo, mean_output_tokens: float) -> BatchChoice | None:
    """B_max = the largest measured batch that meets every SLO term; None if no row does.

    Rows are considered in batch order; the first row above B_max that breaks the SLO names the
    limiting term.
    """
    chosen: ThroughputPoint | None = None
    limited_by: SloTerm | None = None
    for point in sorted(table.points, key=lambda p: p.batch):
        broken = violated_terms(point, slo, mean_output_tokens, table.ttft_mean_s)
        if not broken:
            chosen, limited_by = point, None
        elif chosen is not None and limited_by is None:
            limited_by = broken[0]
    if chosen is None:
        return None
    return BatchChoice(chosen, limited_by, required_stream_tokens_per_s(slo))
