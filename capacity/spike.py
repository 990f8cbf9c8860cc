"""Cold start versus spikes: the backlog a k-fold step builds before new replicas serve, and the fleet
that absorbs the new level.

    demand    = k · λ · ō                                       tokens/s during the spike
    capacity  = N · T_dec                                       tokens/s the running fleet decodes
    backlog   = max(0, demand - capacity) · t_cold              tokens queued when new replicas are ready
    N_spike   = ⌈demand / (rho_target · T_dec)⌉                 replicas that carry the spike at rho_target
    t_drain   = backlog / (N_spike · T_dec - demand)            time for N_spike to clear the backlog

Worked example: 3 * 20 * 300 = 18,000 tok/s against 3 * 4,352 = 13,056 tok/s for 90 s leaves
444,960 tokens ≈ 1,483 requests of 300 tokens; N_spike = ⌈18,000 / (0.8 * 4,352)⌉ = ⌈5.17⌉ = 6;
t_drain = 444,960 / (26,112 - 18,000) ≈ 55 s. The design's figures, ≈ 445,500 tokens and ≈ 1,485
requests, are the same formula with T_dec rounded to 4,350 tok/s (18,000 - 13,050 = 4,950 tok/s * 90 s).
"""

from __future__ import annotations

import math

from capacity.barriers import ceil_count


def spike_demand_tokens_per_s(
    spike_factor: float, arrival_rate_per_s: float, mean_output_tokens: float
) -> float:
    """Output tokens per second demanded during a k-fold spike: k · λ · ō."""
    return spike_factor * arrival_rate_per_s * mean_output_tokens


def cold_start_backlog_tokens(
    demand_tokens_per_s: float, capacity_tokens_per_s: float, cold_start_s: float
) -> float:
    """Tokens that pile up while new replicas start: max(0, demand - capacity) · t_cold.

    The first wave of a spike lands in queues (and admission control) because scaling out takes the
    whole cold start; this is how much the queues must hold, or shed, meanwhile.
    """
    return max(0.0, demand_tokens_per_s - capacity_tokens_per_s) * cold_start_s


def replicas_for_load(
    demand_tokens_per_s: float, decode_tokens_per_s: float, target_utilisation: float
) -> int:
    """Replicas that serve `demand` at or below the target utilisation: ⌈demand / (rho_target · T_dec)⌉."""
    if not 0 < target_utilisation <= 1:
        raise ValueError("target_utilisation must be in (0, 1]")
    if decode_tokens_per_s <= 0:
        raise ValueError("decode_tokens_per_s must be positive")
    return max(1, ceil_count(demand_tokens_per_s / (target_utilisation * decode_tokens_per_s)))


def backlog_drain_s(backlog_tokens: float, capacity_tokens_per_s: float, demand_tokens_per_s: float) -> float:
    """Time to clear a backlog with the spare capacity: backlog / (capacity - demand); inf without spare."""
    if backlog_tokens <= 0:
        return 0.0
    spare = capacity_tokens_per_s - demand_tokens_per_s
    return backlog_tokens / spare if spare > 0 else math.inf
