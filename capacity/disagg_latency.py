"""TTFT and TPOT of a disaggregated pool with P prefill and D decode replicas: what `plan` predicts.

A request waits for a prefill replica, is prefilled, its KV crosses the link, and a decode replica
samples its first token and streams the rest:

    s     = ī / R_p                                  compute of one prompt
    S_p   = ⌈ī / chunk⌉ · t_w + s                    one prompt alone; every step also costs t_w
    T_x   = latency + ī · kv_tok / B_link            KV transfer
    P     = wait + prefill: `prefill_queue` (prompts one per step, chunk < 2 ī) with S_p, or
            `prefill_batching` (chunk ≥ 2 ī, or none: waiting prompts share a step)
    d     = TPOT mean of the decode pool (`decode_queue`), the mean decode step
    F     = i · (T_x + t_w) + (1 − i) · (d/2 + max(d, T_x + d/2) + d)     first token on decode

F: on a busy decode replica the request is admitted at the next step start (d/2 on average), its KV
lands T_x later and it joins the first step that starts after that — never the admission step itself,
planned while its KV was on the link — and that step samples the first token (d); an idle replica
(probability i, `decode_queue`'s idle ratio) starts at once, waits T_x and runs one step of ≈ t_w.

    TTFT mean = P_mean + F + KV wait                 KV wait: for KV on a full decode replica
    TTFT p95  ≈ P95 + F + KV wait                    the prefill queue carries the spread
    TPOT mean and p95: `decode_queue`

t_w and t_kv come from `decode_step` (the table and the bandwidth); n_kv = ⌊M_KV / (kv_tok · (ī + ō))⌋.
`pool_latency` returns None when either pool cannot keep up with λ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.decode_queue import DecodeLatency, decode_latency
from capacity.decode_step import DecodeStepModel
from capacity.prefill_batching import batched_prefill
from capacity.prefill_queue import prefill_wait


@dataclass(frozen=True, slots=True)
class PoolModel:
    """What a workload costs on the hardware, independent of the pool sizes (seconds, tokens)."""

    arrival_rate_per_s: float
    input_tokens: float
    output_tokens: float
    step: DecodeStepModel
    prompt_s: float
    prefill_steps: int
    batched_prefill: bool
    transfer_s: float
    kv_limit_streams: int

    @property
    def prefill_s(self) -> float:
        """S_p = ⌈ī / chunk⌉ · t_w + ī / R_p."""
        return self.prefill_steps * self.step.fixed_s + self.prompt_s


def pool_model(
    *,
    arrival_rate_per_s: float,
    input_tokens: float,
    output_tokens: float,
    step: DecodeStepModel,
    prefill_tokens_per_s: float,
    chunk_tokens: int | None,
    transfer_s: float,
    kv_capacity_tokens: float,
) -> PoolModel:
    """The constants of the module docstring for one workload."""
    steps = 1 if chunk_tokens is None else max(1, math.ceil(input_tokens / chunk_tokens))
    batched = chunk_tokens is None or chunk_tokens >= 2 * input_tokens
    kv_limit = max(1, math.floor(kv_capacity_tokens / (input_tokens + output_tokens)))
    return PoolModel(
        arrival_rate_per_s,
        input_tokens,
        output_tokens,
        step,
        input_tokens / prefill_tokens_per_s,
        steps,
        batched,
        transfer_s,
        kv_limit,
    )


@dataclass(frozen=True, slots=True)
class PrefillLatency:
    """Wait + prefill of one request (seconds) on c replicas, and their utilisation."""

    utilisation_ratio: float
    mean_s: float
    p95_s: float


@dataclass(frozen=True, slots=True)
class PoolLatency:
    """Predicted latencies at one split (seconds)."""

    prefill_replicas: int
    decode_replicas: int
    prefill: PrefillLatency
    decode: DecodeLatency
    first_token_s: float
    ttft_mean_s: float
    ttft_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float


def prefill_latency(model: PoolModel, replicas: int) -> PrefillLatency | None:
    """P of the module docstring on `replicas` prefill replicas; None when they cannot keep up."""
    lam = model.arrival_rate_per_s
    if model.batched_prefill:
        batched = batched_prefill(replicas, lam, model.step.fixed_s, model.prompt_s)
        if batched is None:
            return None
        return PrefillLatency(batched.utilisation_ratio, batched.mean_s, batched.p95_s)
    wait = prefill_wait(replicas, lam, model.prefill_s)
    if math.isinf(wait.mean_s):
        return None
    return PrefillLatency(wait.utilisation_ratio, wait.mean_s + model.prefill_s, wait.p95_s + model.prefill_s)


def first_token_s(decode: DecodeLatency, transfer_s: float, step_fixed_s: float) -> float:
    """F of the module docstring."""
    d = decode.tpot_mean_s
    busy_s = d / 2 + max(d, transfer_s + d / 2) + d
    return decode.idle_ratio * (transfer_s + step_fixed_s) + (1 - decode.idle_ratio) * busy_s


def decode_pool_latency(model: PoolModel, decode_replicas: int) -> DecodeLatency | None:
    """The decode half alone (it does not depend on the prefill pool); None when unstable."""
    return decode_latency(
        model.step,
        model.arrival_rate_per_s,
        input_tokens=model.input_tokens,
        output_tokens=model.output_tokens,
        replicas=decode_replicas,
        kv_limit_streams=model.kv_limit_streams,
    )


def combine(model: PoolModel, prefill: PrefillLatency, decode: DecodeLatency) -> tuple[float, float, float]:
    """(F, TTFT mean, TTFT p95) from the two halves."""
    first_s = first_token_s(decode, model.transfer_s, model.step.fixed_s)
    after_s = first_s + decode.kv_wait_s
    return first_s, prefill.mean_s + after_s, prefill.p95_s + after_s


def pool_latency(model: PoolModel, prefill_replicas: int, decode_replicas: int) -> PoolLatency | None:
    """TTFT and TPOT at P prefill and D decode replicas; None when either pool is unstable."""
    decode = decode_pool_latency(model, decode_replicas)
    prefill = prefill_latency(model, prefill_replicas)
    if decode is None or prefill is None:
        return None
    first_s, ttft_mean_s, ttft_p95_s = combine(model, prefill, decode)
    return PoolLatency(
        prefill_replicas=prefill_replicas,
        decode_replicas=decode_replicas,
        prefill=prefill,
        decode=decode,
        first_token_s=first_s,
        ttft_mean_s=ttft_mean_s,
        ttft_p95_s=ttft_p95_s,
        tpot_mean_s=decode.tpot_mean_s,
        tpot_p95_s=decode.tpot_p95_s,
    )
