"""What a token costs: the GPU-hour price spread over the tokens the GPU actually delivers.

    cost per 10^6 tokens = price_per_hour / (tokens_per_s * 3,600) * 10^6

Worked example at $2.5 per GPU-hour: at the operating batch 64 (4,352 tok/s) ≈ $0.16; at batch 16
(1,680 tok/s) ≈ $0.41; when only 30 % of the capacity does useful work, $0.16 / 0.3 ≈ $0.53. Small
batches, idle headroom and work that misses its SLO (no goodput) all raise the price of a token.
"""

from __future__ import annotations

SECONDS_PER_HOUR = 3_600
TOKENS_PER_MILLION = 1_000_000


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    """price / (tokens_per_s * 3,600) * 10^6 — for one GPU at its rate, or a fleet at its served rate."""
    if tokens_per_s <= 0:
        raise ValueError("tokens_per_s must be positive")
    return usd_per_hour / (tokens_per_s * SECONDS_PER_HOUR) * TOKENS_PER_MILLION


def useful_load_usd_per_million_tokens(
    full_load_usd_per_million_tokens: float, useful_load_ratio: float
) -> float:
    """Cost when only a fraction u of the capacity is useful (goodput): cost at full load / u."""
    if not 0 < useful_load_ratio <= 1:
        raise ValueError("useful_load_ratio must be in (0, 1]")
    return full_load_usd_per_million_tokens / useful_load_ratio
