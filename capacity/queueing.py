"""Utilisation and the queueing knee: why a pool must run below rho = 1, and how far below.

    rho(n)        = λ · ō / (n · T_dec)                          token-throughput utilisation of n GPUs
    M/M/1:  W / S = 1 / (1 - rho)                                3.3x at rho = 0.7, 10x at rho = 0.9
    M/M/c:  W / S = 1 + C(c, a) / (c · (1 - rho)), a = c · rho   C = Erlang C, probability of waiting

W is the time in system and S the service time, so W / S is the latency multiplier queueing adds.
In the plan, M/M/c takes the replicas as its c servers (each serving at T_dec / ō requests/s): c
pooled servers can run hotter than one at the same multiplier, but the knee at rho → 1 remains.
Treating the N · B_max batch slots as servers instead would be optimistic, because per-stream speed
falls as slots fill. Worked example: rho(2) = 6,000 / 8,704 ≈ 0.69; rho(3) ≈ 0.46.
"""

from __future__ import annotations

import math


def utilisation_ratio(
    arrival_rate_per_s: float, mean_output_tokens: float, n_replicas: int, decode_tokens_per_s: float
) -> float:
    """rho = λ · ō / (n · T_dec); `math.inf` for n = 0 (no capacity at all)."""
    if decode_tokens_per_s <= 0:
        raise ValueError("decode_tokens_per_s must be positive")
    if n_replicas <= 0:
        return math.inf
    return arrival_rate_per_s * mean_output_tokens / (n_replicas * decode_tokens_per_s)


def occupancy_ratio(concurrency_requests: float, n_replicas: int, b_max: int) -> float:
    """Mean batch occupancy L / (n · B_max): the share of the SLO-safe slots in use; inf for n = 0."""
    if n_replicas <= 0:
        return math.inf
    return concurrency_requests / (n_replicas * b_max)


def mm1_time_multiplier_ratio(utilisation: float) -> float:
    """M/M/1 time in system over service time: W / S = 1 / (1 - rho); `math.inf` when rho ≥ 1 (unstable)."""
    if utilisation < 0:
        raise ValueError("utilisation must be >= 0")
    if utilisation >= 1:
        return math.inf
    return 1.0 / (1.0 - utilisation)


def erlang_c_probability(servers: int, utilisation: float) -> float:
    """Erlang C: probability an arrival waits in an M/M/c queue with c servers at per-server load rho.

    Computed through the Erlang B recursion (stable for large c): B(0) = 1,
    B(k) = a · B(k-1) / (k + a · B(k-1)) with offered load a = c · rho; then C = B / (1 - rho · (1 - B)).
    Returns 1.0 when rho ≥ 1 (every arrival waits, the queue grows without bound).
    """
    if servers <= 0:
        raise ValueError("servers must be positive")
    if utilisation < 0:
        raise ValueError("utilisation must be >= 0")
    if utilisation >= 1:
        return 1.0
    offered = servers * utilisation
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return blocking / (1.0 - utilisation * (1.0 - blocking))


def mmc_time_multiplier_ratio(servers: int, utilisation: float) -> float:
    """M/M/c time in system over service time: W / S = 1 + C(c, a) / (c · (1 - rho)).

    With c = 1 this is the M/M/1 1 / (1 - rho). `math.inf` when rho ≥ 1 or there are no servers.
    """
    if servers <= 0 or utilisation >= 1:
        return math.inf
    waiting = erlang_c_probability(servers, utilisation)
    return 1.0 + waiting / (servers * (1.0 - utilisation))
