"""The metric names each engine flavour exports, and the adapter registry keyed by flavour name.

Every name below was read in the engine's own source (repository and path in the comment above each
table). Candidates are listed newest first; the adapter takes the first one present.

- vllm: running `vllm:num_requests_running`, waiting `vllm:num_requests_waiting`, KV
  `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`), hit ratio Δ`vllm:prefix_cache_hits_total`
  / Δ`vllm:prefix_cache_queries_total` (V0: gauge `vllm:gpu_prefix_cache_hit_rate`);
- sglang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, KV `sglang:token_usage`, hit ratio gauge
  `sglang:cache_hit_rate` (else Δ`sglang:cached_tokens_total` / Δ`sglang:prompt_tokens_total`);
- token latency (the batch budget's signal): the inter-token latency histogram,
  `vllm:inter_token_latency_seconds` (older: `vllm:time_per_output_token_seconds`) and
  `sglang:inter_token_latency_seconds` (older: `sglang:time_per_output_token_seconds`); TGI and
  llama.cpp export none;
- tgi: `tgi_batch_current_size`, `tgi_queue_size`; no KV usage, no prefix-cache metrics;
- llamacpp: `llamacpp:requests_processing`, `llamacpp:requests_deferred`, KV `llamacpp:kv_cache_usage_ratio`
  (older builds only), hit ratio Δ`llamacpp:prompt_tokens_cached_total` / Δ(`llamacpp:prompt_tokens_total`
  + cached), as `prompt_tokens_total` excludes cached tokens.

`openai` is a plain OpenAI-compatible endpoint with no known /metrics: it has no adapter and is not
scraped (`adapter_for("openai")` is None); routing then uses the gateway's own in-flight counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gateway.upstream.engine_metrics.adapter import CounterPair, FlavourSpec, MetricsAdapter, SpecAdapter

# vLLM — vllm-project/vllm, vllm/v1/metrics/loggers.py (PrometheusStatLogger; labels model_name, engine):
# gauges vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (a fraction
# despite the name; "1 means 100 percent usage"), vllm:gpu_cache_usage_perc (deprecated in 0.9, same
# value); counters vllm:prefix_cache_queries / vllm:prefix_cache_hits (tokens; exposed with `_total`),
# their deprecated vllm:gpu_prefix_cache_* twins, vllm:prompt_tokens, vllm:generation_tokens,
# vllm:num_preemptions; histogram vllm:time_to_first_token_seconds; gauge vllm:lora_requests_info
# (labels max_lora, running_lora_adapters, waiting_lora_adapters; value = when that label set was last
# set). The v0 engine (vllm/engine/metrics.py) exported a gauge vllm:gpu_prefix_cache_hit_rate instead
# of the counters.
VLLM = FlavourSpec(
    flavour="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    hit_ratio_gauges=("vllm:gpu_prefix_cache_hit_rate",),
    lora_info=("vllm:lora_requests_info",),
    token_latency=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    hit_counters=(
        CounterPair(hits=("vllm:prefix_cache_hits_total",), queries=("vllm:prefix_cache_queries_total",)),
        CounterPair(
            hits=("vllm:gpu_prefix_cache_hits_total",), queries=("vllm:gpu_prefix_cache_queries_total",)
        ),
    ),
)

# SGLang — sgl-project/sglang, python/sglang/srt/metrics/collector.py: SchedulerMetricsCollector gauges
# sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage (KV pool usage, 0..1),
# sglang:cache_hit_rate ("The prefix cache hit rate"); TokenizerMetricsCollector counters
# sglang:prompt_tokens_total (prompt tokens including cached ones), sglang:cached_tokens_total,
# sglang:generation_tokens_total, histogram sglang:time_to_first_token_seconds. Label model_name
# (plus engine_type / tp_rank / pp_rank / dp_rank on scheduler metrics in recent versions).
SGLANG = FlavourSpec(
    flavour="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    hit_ratio_gauges=("sglang:cache_hit_rate",),
    token_latency=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    hit_counters=(
        CounterPair(hits=("sglang:cached_tokens_total",), queries=("sglang:prompt_tokens_total",)),
    ),
)

# TGI — huggingface/text-generation-inference: gauge tgi_queue_size in backends/v3/src/queue.rs,
# gauges tgi_batch_current_size and tgi_batch_current_max_tokens in backends/v3/src/backend.rs, all
# described in router/src/server.rs (no labels). TGI exports neither a KV-usage ratio nor prefix-cache
# counters, so both stay None.
TGI = FlavourSpec(
    flavour="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    model_label=None,
)

# llama.cpp server — ggml-org/llama.cpp, tools/server/server-task.cpp (server_task_result_metrics::
# to_metrics; earlier in tools/server/server-context.cpp and examples/server/server.cpp), no labels:
# gauges llamacpp:requests_processing, llamacpp:requests_deferred; counters llamacpp:prompt_tokens_total
# ("excluding cached tokens") and llamacpp:prompt_tokens_cached_total (recent builds), tokens_predicted_total.
# llamacpp:kv_cache_usage_ratio exists only in older builds (examples/server/server.cpp, documented in
# that README); current builds do not export it, so KV usage is then None.
LLAMACPP = FlavourSpec(
    flavour="llamacpp",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
    hit_counters=(
        CounterPair(
            hits=("llamacpp:prompt_tokens_cached_total",),
            queries=("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
        ),
    ),
    model_label=None,
)

NOT_SCRAPED_FLAVOURS = frozenset({"openai"})

ADAPTERS: Mapping[str, MetricsAdapter] = MappingProxyType(
    {spec.flavour: SpecAdapter(spec) for spec in (VLLM, SGLANG, TGI, LLAMACPP)}
)


def known_flavours() -> tuple[str, ...]:
    """Every flavour name a pool may configure: the scraped ones, then those that are not."""
    return (*ADAPTERS, *sorted(NOT_SCRAPED_FLAVOURS))


def adapter_for(flavour: str) -> MetricsAdapter | None:
    """The adapter for `flavour`, or None for a flavour that is not scraped (`openai`).

    Raises `ValueError` for an unknown flavour (settings validation should have caught it).
    """
    adapter = ADAPTERS.get(flavour)
    if adapter is None and flavour not in NOT_SCRAPED_FLAVOURS:
        raise ValueError(f"unknown engine flavour {flavour!r}; known: {', '.join(known_flavours())}")
    return adapter
