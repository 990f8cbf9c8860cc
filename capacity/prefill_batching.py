"""Prefill latency when short prompts share steps: every prompt waiting when a step starts joins it.

With a chunk budget of b ≥ 2 prompts (chunk ≥ 2 ī, or no budget) a prefill replica does not serve
prompts one by one: a step takes every prompt that has arrived, and costs t_w + k · s for k prompts
(t_w the fixed cost of a step, s = ī / R_p). So a request waits only for the rest of the step in
progress, then runs in the next step with the others that arrived during it. On one replica with
Poisson arrivals at λ the batch sizes of consecutive steps form a Markov chain:

    L(k)   = t_w + k · s                            a step of k prompts
    k' ~ Poisson(λ · L(k)), or 1 when that is 0     (the replica then idles until the next arrival)

and, with its stationary law π (power iteration), an arriving request finds

    an idle replica  with time share  Σ π_k e^(−λ L(k)) / λ       latency t_w + s
    a step of k      with time share  π_k · L(k)                   latency U · L(k) + t_w + s · (1 + N)

(normalised; U uniform on [0, 1) the rest of that step, N ~ Poisson(λ · L(k)) the others of its batch).
Mean and p95 follow (the p95 by bisection on the mixture's tail). This is exact for one replica with an
unlimited budget; the budget b is ignored (batches beyond b are rare below saturation). With c replicas
each is taken to receive λ / c at random, which overstates the latency (least-load avoids busy replicas).
Unstable (`None`) when λ · s ≥ c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

P95_TAIL_RATIO = 0.05
_CONVERGED = 1e-12
_MAX_ITERATIONS = 100_000


@dataclass(frozen=True, slots=True)
class BatchedPrefill:
    """Wait plus prefill (seconds) of one request, and the replicas' utilisation λ · s / c."""

    utilisation_ratio: float
    mean_s: float
    p95_s: float


def _poisson(mean: float, terms: int) -> list[float]:
    probabilities = [math.exp(-mean)]
    for k in range(1, terms):
        probabilities.append(probabilities[-1] * mean / k)
    return probabilities


def _stationary_batches(rate: float, step_fixed_s: float, prompt_s: float, largest: int) -> list[float]:
    """π over batch sizes 1..largest (index 0 unused) by power iteration."""
    moves = []
    for k in range(1, largest + 1):
        p = _poisson(rate * (step_fixed_s + k * prompt_s), largest + 1)
        p[1] += p[0]
        p[0] = 0.0
        moves.append(p)
    pi = [0.0] * (largest + 1)
    pi[1] = 1.0
    for _ in range(_MAX_ITERATIONS):
        nxt = [0.0] * (largest + 1)
        for k in range(1, largest + 1):
            weight = pi[k]
            if weight > 0.0:
                row = moves[k - 1]
                for j in range(1, largest + 1):
                    nxt[j] += weight * row[j]
        total = sum(nxt)
        nxt = [x / total for x in nxt]
        change = sum(abs(a - b) for a, b in zip(nxt, pi, strict=True))
        pi = nxt
        if change < _CONVERGED:
            break
    return pi


def batched_prefill(
    replicas: int, arrival_rate_per_s: float, step_fixed_s: float, prompt_s: float
) -> BatchedPrefill | None:
    """The module docstring's latency at λ / c per replica; None when λ · s ≥ c."""
    if replicas < 1 or arrival_rate_per_s <= 0 or prompt_s <= 0 or step_fixed_s < 0:
        raise ValueError("replicas, arrival rate and prompt time must be positive")
    rate = arrival_rate_per_s / replicas
    load = rate * prompt_s
    if load >= 1:
        return None
    steady = rate * step_fixed_s / (1 - load)
    largest = math.ceil(steady + 12 * math.sqrt(steady + 1) + 12)
    pi = _stationary_batches(rate, step_fixed_s, prompt_s, largest)
    steps = [
        (pi[k] * (step_fixed_s + k * prompt_s), step_fixed_s + k * prompt_s) for k in range(1, largest + 1)
    ]
    idle = sum(pi[k] * math.exp(-rate * (step_fixed_s + k * prompt_s)) / rate for k in range(1, largest + 1))
    total = idle + sum(share for share, _ in steps)
    alone_s = step_fixed_s + prompt_s
    mean_s = idle / total * alone_s + sum(
        share / total * (length / 2 + alone_s + prompt_s * rate * length) for share, length in steps
    )
    batches = [(share / total, length, _poisson(rate * length, largest + 1)) for share, length in steps]

    def tail(t_s: float) -> float:
        above = idle / total if alone_s > t_s else 0.0
        for weight, length, others in batches:
            for n, p in enumerate(others):
                x = (t_s - alone_s - prompt_s * n) / length
                above += weight * p * (1.0 if x <= 0 else max(0.0, 1.0 - x))
        return above

    low, high = 0.0, alone_s
    while tail(high) > P95_TAIL_RATIO:
        low, high = high, high * 2
    for _ in range(60):
        middle = (low + high) / 2
        if tail(middle) > P95_TAIL_RATIO:
            low = middle
        else:
            high = middle
    return BatchedPrefill(load, mean_s, high)
