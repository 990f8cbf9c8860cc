"""The decode pool as one queue: streams share each replica's steps, so the more streams, the slower each.

D decode replicas; each request goes to the one with the fewest in flight, so N streams in the pool sit
⌊N/D⌋ or ⌈N/D⌉ to a replica. A replica with k streams runs a step every step(k, c̄) seconds
(`decode_step`) and each stream gains one token per step; a request needs ō tokens. At most n_kv
streams run on a replica (KV memory); the others wait for KV. The pool serves

    φ(N)  = Σ_replicas min(k_j, n_kv) / step(min(k_j, n_kv), c̄)     tokens per second
    c̄     = ī + ō / 2                                                mean context of a decoding stream

and with arrivals at λ, N is a birth–death chain (up λ, down φ(N) / ō) whose stationary law — the same
whatever the spread of output lengths, as for any processor-sharing queue — is

    π(N) ∝ Π_{k=1..N} λ · ō / φ(k)

Read from π, by Little's law on the running streams and on those waiting for KV:

    TPOT mean  = E[running] / (λ · ō)
    TPOT p95   ≈ step(min(N95 / D, n_kv), c̄)            N95: the 95th percentile of N
    KV wait    = E[waiting] / λ                         mean, it adds to TTFT
    idle ratio = P(N < D)                               a new request finds its replica empty

The p95 is a heuristic, checked by the planner validation (docs/CAPACITY.md): a request's TPOT is the
mean step over its life, and crowded periods last longer because their steps are slower, so requests
meet the stationary tail of N rather than its average. `decode_latency` returns None when the pool
cannot keep up: λ · ō ≥ φ(∞) = D · n_kv / step(n_kv, c̄), or a chain longer than `MAX_STATES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.decode_step import DecodeStepModel

P95_RATIO = 0.95
MAX_STATES = 2_000_000
_NEGLIGIBLE_LOG = -40.0
"""Stop summing π once a term is e^−40 of the largest and falling."""


@dataclass(frozen=True, slots=True)
class DecodeLatency:
    """Per-request decode latency of a pool, and the load behind it (module docstring)."""

    tpot_mean_s: float
    tpot_p95_s: float
    streams_mean: float
    streams_p95_per_replica: float
    kv_wait_s: float
    idle_ratio: float


def _served_tokens_per_s(
    streams: int, replicas: int, step: DecodeStepModel, ctx: float, kv_limit: int
) -> float:
    """φ(N) for a balanced split of N streams over D replicas."""
    low, extra = divmod(streams, replicas)

    def replica(k: int) -> float:
        running = min(k, kv_limit)
        return running / step.step_s(running, ctx) if running else 0.0

    return extra * replica(low + 1) + (replicas - extra) * replica(low)


def decode_latency(
    step: DecodeStepModel,
    arrival_rate_per_s: float,
    *,
    input_tokens: float,
    output_tokens: float,
    replicas: int,
    kv_limit_streams: int,
) -> DecodeLatency | None:
    """The module docstring's figures for `replicas` decode replicas; None when unstable."""
    if replicas < 1 or kv_limit_streams < 1 or arrival_rate_per_s <= 0 or output_tokens <= 0:
        raise ValueError("replicas, the KV limit, the arrival rate and the output length must be positive")
    ctx = input_tokens + output_tokens / 2
    demand = arrival_rate_per_s * output_tokens
    if demand >= replicas * kv_limit_streams / step.step_s(kv_limit_streams, ctx):
        return None
    log_weights = [0.0]
    peak = 0.0
    while True:
        n = len(log_weights)
        if n > MAX_STATES:
            return None
        ratio = demand / _served_tokens_per_s(n, replicas, step, ctx, kv_limit_streams)
        log_weights.append(log_weights[-1] + math.log(ratio))
        peak = max(peak, log_weights[-1])
        if ratio < 1 and log_weights[-1] < peak + _NEGLIGIBLE_LOG:
            break
    weights = [math.exp(w - peak) for w in log_weights]
    total = sum(weights)
    running = waiting = streams = 0.0
    cumulative, n95 = 0.0, None
    for n, weight in enumerate(weights):
        p = weight / total
        low, extra = divmod(n, replicas)
        run = extra * min(low + 1, kv_limit_streams) + (replicas - extra) * min(low, kv_limit_streams)
        running += p * run
        waiting += p * (n - run)
        streams += p * n
        cumulative += p
        if n95 is None and cumulative >= P95_RATIO:
            n95 = n
    assert n95 is not None
    per_replica_p95 = n95 / replicas
    return DecodeLatency(
        tpot_mean_s=running / demand,
        tpot_p95_s=step.step_s(min(per_replica_p95, kv_limit_streams), ctx),
        streams_mean=streams,
        streams_p95_per_replica=per_replica_p95,
        kv_wait_s=waiting / arrival_rate_per_s,
        idle_ratio=sum(weights[:replicas]) / total,
    )
