"""What an adapter reads out of one /metrics scrape, and why a scrape can fail.

`EngineSample` is flavour-neutral: every adapter maps its engine's names onto it. `ScrapeErrorReason`
values double as the `reason` label of `llm_gateway_scrape_errors_total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from router.types import EngineLoad


class ScrapeErrorReason(StrEnum):
    """Why a replica has no fresh engine sample (a metric label: a closed, small set)."""

    TIMEOUT = "timeout"  # no complete answer within the per-request timeout
    CONNECT = "connect"  # connection refused / reset before a response
    TRANSPORT = "transport"  # any other HTTP transport or protocol error
    HTTP_STATUS = "http_status"  # the engine answered, but not 200 (e.g. 404: /metrics disabled)
    PARSE = "parse"  # a wanted sample line is not valid Prometheus text
    MISSING_METRICS = "missing_metrics"  # parsed, but a required metric (running, waiting) is absent
    STALE = "stale"  # counted once each time a replica's last good sample passes the staleness bound


class EngineMetricsError(Exception):
    """A scrape that produced no usable sample; `reason` says which kind (see `ScrapeErrorReason`)."""

    def __init__(self, reason: ScrapeErrorReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One engine's self-report at `taken_at_s` (the scraper's clock, when the answer arrived).

    `running` / `waiting` are request counts (summed over the engine's data-parallel ranks);
    `kv_usage_ratio` is in [0, 1], or None when the flavour does not export it (TGI, current llama.cpp);
    `prefix_cache_hit_ratio` is in [0, 1] — over the last closed counter window (see the adapter) when it
    comes from counters — or None when unknown. The prefix-cache counters (tokens) at the start of the
    open window are kept so the next scrape can compute its ratio from the deltas.
    """

    running: float
    waiting: float
    kv_usage_ratio: float | None
    prefix_cache_hit_ratio: float | None
    taken_at_s: float
    prefix_cache_window_hits_tokens: float | None = None
    """The hit / query counters where the open window started (None without counters)."""
    prefix_cache_window_queries_tokens: float | None = None
    running_adapters: frozenset[str] = frozenset()
    """LoRA adapters with requests running / waiting on the engine (vLLM's `vllm:lora_requests_info`;
    empty for flavours that do not export it)."""
    waiting_adapters: frozenset[str] = frozenset()
    max_loras: int | None = None
    token_latency_s: float | None = None
    """The engine's mean inter-token latency (seconds) over the window this scrape closed; None when it
    closed none (see the adapter's "Token latency" rule)."""
    token_window_sum_s: float | None = None
    """The inter-token histogram's sum and count where the open window started (None without one)."""
    token_window_count: float | None = None

    def to_load(self, now_s: float) -> EngineLoad:
        """The routing view of this sample at `now_s` (fresh; a missing KV ratio reads as 0.0)."""
        return EngineLoad(
            running=self.running,
            waiting=self.waiting,
            kv_usage_ratio=self.kv_usage_ratio if self.kv_usage_ratio is not None else 0.0,
            prefix_cache_hit_ratio=self.prefix_cache_hit_ratio,
            age_s=max(0.0, now_s - self.taken_at_s),
            stale=False,
            running_adapters=self.running_adapters,
            max_loras=self.max_loras,
        )
