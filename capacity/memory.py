"""KV-cache and weight memory of one replica (one GPU), and the bandwidth roofline of decoding.

Worked example (DESIGN.md §7, 13B FP16 on an 80 GB GPU): kv_tok = 2 * 40 * 8 * 128 * 2 = 163,840 B;
weights = 13·10^9 * 2 B = 26 GB; M_KV = 80 - 26 - 10 = 44 GB; 44·10^9 / 163,840 ≈ 268,554 KV tokens
(the design's "≈268,000").
"""

from __future__ import annotations

import math


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_element: float) -> float:
    """KV-cache bytes one token occupies.

    kv_tok = 2 * n_layers * n_kv_heads * d_head * bytes — the 2 is one K and one V vector per layer
    and KV head (grouped-query attention shares them, hence KV heads, not attention heads).
    """
    if min(n_layers, n_kv_heads, head_dim) <= 0 or bytes_per_element <= 0:
        raise ValueError("model dimensions and element size must be positive")
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_element


def weights_bytes(parameters: float, bytes_per_parameter: float) -> float:
    """Weight memory: parameters * bytes per parameter (13·10^9 * 2 = 26·10^9 B)."""
    return parameters * bytes_per_parameter


def kv_budget_bytes(memory_bytes: float, weights_bytes: float, overhead_bytes: float) -> float:
    """M_KV = HBM - weights - overhead: what is left for the KV cache. Negative means it does not fit."""
    return memory_bytes - weights_bytes - overhead_bytes


def kv_capacity_tokens(budget_bytes: float, kv_tok_bytes: float) -> int:
    """Total KV tokens one replica holds: floor(M_KV / kv_tok)."""
    if kv_tok_bytes <= 0:
        raise ValueError("kv_tok_bytes must be positive")
    return max(0, math.floor(budget_bytes / kv_tok_bytes))


def kv_resident_requests(capacity_tokens: float, context_tokens: float) -> float:
    """Requests whose whole context fits in one replica's KV cache at once: KV tokens / ctx.

    This is the memory ceiling on a replica's batch; B_max from the SLO is normally far below it.
    """
    if context_tokens <= 0:
        raise ValueError("context_tokens must be positive")
    return capacity_tokens / context_tokens


def decode_roofline_stream_tokens_per_s(
    weights_bytes: float,
    kv_tok_bytes: float,
    batch: int,
    context_tokens: float,
    bandwidth_bytes_per_s: float,
) -> float:
    """Upper bound on per-stream decode speed when decoding is memory-bandwidth bound.

    Each decode step reads the weights once and every stream's KV:
    t_step = (weights + B * ctx * kv_tok) / bandwidth; each stream gains one token per step, so
    per-stream speed ≤ 1 / t_step (and aggregate ≤ B / t_step). A measured speed above this bound
    means the inputs disagree; real engines reach roughly 50-80 % of it.
    """
    if bandwidth_bytes_per_s <= 0 or batch <= 0:
        raise ValueError("bandwidth and batch must be positive")
    step_s = (weights_bytes + batch * context_tokens * kv_tok_bytes) / bandwidth_bytes_per_s
    return 1.0 / step_s
