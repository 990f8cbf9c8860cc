"""The three barriers that decide how many GPUs a pool needs, Little's law, and headroom.

    W       = TTFT_mean + ō / v(B_max)                      time in system of a mean request
    L       = λ · W                                         requests in the system (Little's law)
    N_thr   = λ · ō / T_dec                                 throughput: tokens/s needed ÷ tokens/s per GPU
    N_lat   = L / B_max                                     latency: concurrent streams ÷ streams per GPU
    N_mem   = L · ctx · kv_tok / M_KV                       memory: KV bytes in flight ÷ KV bytes per GPU
    N_base  = max(⌈N_thr⌉, ⌈N_lat⌉, ⌈N_mem⌉)
    N       = max(min_replicas, ⌈N_base · (1 + r)⌉)

T_dec is the aggregate decode rate measured at B_max, v(B_max) the per-stream rate there.

Worked example (λ = 20 req/s, ō = 300, ctx = 800, TTFT_mean = 0.09 s, v = 68, T_dec = 4,352):
W = 0.09 + 300/68 ≈ 4.50 s; L ≈ 90.0; N_thr = 6,000/4,352 ≈ 1.38 → 2; N_lat = 90/64 ≈ 1.41 → 2;
N_mem = 90 * 800 * 163,840 / 44·10^9 ≈ 0.27 → 1; N_base = 2; r = 0.5 → N = 3. The design's
"W ≈ 4.5 s" with 300/68 ≈ 4.41 s of decode implies a mean TTFT of ≈ 0.09 s, which the example uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

_CEIL_SLACK = 1e-9
"""Relative slack so that float noise (2 * 1.5 = 3.0000000000000004) does not add a whole GPU."""


class Barrier(StrEnum):
    """Which barrier sets N_base (a label for the plan and, later, the autoscaling metric)."""

    THROUGHPUT = "throughput"
    LATENCY = "latency"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class BarrierCounts:
    """GPU counts per barrier, before (`*_gpus`) and after rounding up (`n_*`), and which one binds.

    `binding` is the barrier with the largest unrounded requirement: ceilings often tie (2, 2, 1 in
    the worked example) and the unrounded value says which constraint is closest to needing one more
    GPU (there latency, 1.41 > 1.38).
    """

    throughput_gpus: float
    latency_gpus: float
    memory_gpus: float
    n_throughput: int
    n_latency: int
    n_memory: int
    binding: Barrier
    n_base: int


def ceil_count(value: float) -> int:
    """⌈value⌉ tolerant of float noise, at least 0."""
    return max(0, math.ceil(value * (1 - _CEIL_SLACK)))


def time_in_system_s(ttft_mean_s: float, mean_output_tokens: float, stream_tokens_per_s: float) -> float:
    """W = TTFT_mean + ō / v: waiting for the first token, then decoding ō tokens at v tok/s."""
    if stream_tokens_per_s <= 0:
        raise ValueError("stream_tokens_per_s must be positive")
    return ttft_mean_s + mean_output_tokens / stream_tokens_per_s


def littles_law_requests(arrival_rate_per_s: float, time_in_system_s: float) -> float:
    """L = λ · W: mean number of requests in the system (in flight on the GPUs)."""
    return arrival_rate_per_s * time_in_system_s


def throughput_gpus(
    arrival_rate_per_s: float, mean_output_tokens: float, decode_tokens_per_s: float
) -> float:
    """Throughput barrier: λ · ō / T_dec GPUs (output tokens demanded ÷ produced per GPU)."""
    if decode_tokens_per_s <= 0:
        raise ValueError("decode_tokens_per_s must be positive")
    return arrival_rate_per_s * mean_output_tokens / decode_tokens_per_s


def latency_gpus(concurrency_requests: float, b_max: int) -> float:
    """Latency (concurrency) barrier: L / B_max GPUs (streams in flight ÷ streams per GPU within SLO)."""
    if b_max <= 0:
        raise ValueError("b_max must be positive")
    return concurrency_requests / b_max


def memory_gpus(
    concurrency_requests: float, context_tokens: float, kv_tok_bytes: float, kv_budget_bytes: float
) -> float:
    """Memory barrier: L · ctx · kv_tok / M_KV GPUs (KV bytes in flight ÷ KV budget per GPU)."""
    if kv_budget_bytes <= 0:
        raise ValueError("kv_budget_bytes must be positive")
    return concurrency_requests * context_tokens * kv_tok_bytes / kv_budget_bytes


def barrier_counts(throughput: float, latency: float, memory: float) -> BarrierCounts:
    """Round each barrier up, take the maximum as N_base (at least 1), and name the binding barrier."""
    raw = {Barrier.THROUGHPUT: throughput, Barrier.LATENCY: latency, Barrier.MEMORY: memory}
    binding = max(raw, key=lambda barrier: raw[barrier])
    counts = {barrier: ceil_count(value) for barrier, value in raw.items()}
    return BarrierCounts(
        throughput_gpus=throughput,
        latency_gpus=latency,
        memory_gpus=memory,
        n_throughput=counts[Barrier.THROUGHPUT],
        n_latency=counts[Barrier.LATENCY],
        n_memory=counts[Barrier.MEMORY],
        binding=binding,
        n_base=max(1, *counts.values()),
    )


def replicas_with_headroom(n_base: int, headroom_ratio: float, min_replicas: int = 1) -> int:
    """N = max(min_replicas, ⌈N_base · (1 + r)⌉): headroom for spikes, failures and the queueing knee."""
    if headroom_ratio < 0:
        raise ValueError("headroom_ratio must be >= 0")
    return max(min_replicas, ceil_count(n_base * (1 + headroom_ratio)))
