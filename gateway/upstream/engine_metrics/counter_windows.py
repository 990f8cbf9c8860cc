"""Windows over an engine's cumulative counters, between two scrapes: the prefix-cache hit ratio over
the last window that queried at least `MIN_WINDOW_QUERY_TOKENS`, and the mean time between a
sequence's tokens over a window of at least `MIN_WINDOW_TOKEN_GAPS` gaps (the rules are in the
`gateway.upstream.engine_metrics.adapter` docstring). Each takes the previous sample, where the open
window starts, and says what to report and where the next window starts; a counter that went
backwards (an engine restart) reopens the window. Apart from the adapter because this is arithmetic
on counters, whatever the flavour.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.upstream.engine_metrics.sample import EngineSample


def clamp_ratio(value: float) -> float:
    """`value` held to [0, 1]."""
    return min(1.0, max(0.0, value))


MIN_WINDOW_QUERY_TOKENS = 256.0
"""Queried tokens a counter window needs before its ratio is reported (about one short prompt): small
enough to follow a busy engine every scrape, large enough that one counter's late bump (llama.cpp's
processed tokens after its cached ones) moves the ratio by a few per cent, not to 0."""


@dataclass(frozen=True, slots=True)
class HitCounters:
    """The ratio to report and the counters where the open window starts."""

    ratio: float | None
    window_hits_tokens: float
    window_queries_tokens: float


def counter_ratio(previous: EngineSample | None, hits: float, queries: float) -> HitCounters:
    """Hit ratio over the last closed window of cumulative counters (the adapter's docstring)."""
    start_hits = previous.prefix_cache_window_hits_tokens if previous is not None else None
    start_queries = previous.prefix_cache_window_queries_tokens if previous is not None else None
    if (
        previous is None
        or start_hits is None
        or start_queries is None
        or queries < start_queries
        or hits < start_hits
    ):
        cumulative = clamp_ratio(hits / queries) if queries > 0 else None
        return HitCounters(cumulative, hits, queries)
    delta_queries = queries - start_queries
    window_ratio = clamp_ratio((hits - start_hits) / delta_queries) if delta_queries > 0 else None
    if delta_queries >= MIN_WINDOW_QUERY_TOKENS:
        return HitCounters(window_ratio, hits, queries)
    carried = previous.prefix_cache_hit_ratio
    return HitCounters(carried if carried is not None else window_ratio, start_hits, start_queries)


MIN_WINDOW_TOKEN_GAPS = 32
"""A token-latency window closes once it holds this many gaps (one busy scrape interval holds far more;
a lone stream at 20 ms a token closes one about every 0.6 s)."""


@dataclass(frozen=True, slots=True)
class TokenWindow:
    """The window's mean to report (None: no window closed) and the counters where the open one starts."""

    latency_s: float | None
    start_sum_s: float
    start_count: float


def token_window(previous: EngineSample | None, total_s: float, count: float) -> TokenWindow:
    """Token latency over the window this scrape closes, if it closes one (the adapter's docstring)."""
    start_sum = previous.token_window_sum_s if previous is not None else None
    start_count = previous.token_window_count if previous is not None else None
    if start_sum is None or start_count is None or count < start_count or total_s < start_sum:
        return TokenWindow(None, total_s, count)  # first sample, or the engine restarted
    gaps = count - start_count
    if gaps < MIN_WINDOW_TOKEN_GAPS:
        return TokenWindow(None, start_sum, start_count)
    return TokenWindow((total_s - start_sum) / gaps, total_s, count)
