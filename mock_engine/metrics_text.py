"""Prometheus text for the mock engine, with vLLM's metric names (vllm/v1/metrics/loggers.py)."""

from __future__ import annotations

from mock_engine.core import EngineStats


def render_metrics(model: str, stats: EngineStats) -> bytes:
    label = f'{{model_name="{model}"}}'
    rows = [
        ("vllm:num_requests_running", "gauge", stats.running),
        ("vllm:num_requests_waiting", "gauge", stats.waiting),
        ("vllm:kv_cache_usage_perc", "gauge", stats.kv_usage_ratio),
        ("vllm:prefix_cache_queries_total", "counter", stats.prefix_cache_queries_tokens),
        ("vllm:prefix_cache_hits_total", "counter", stats.prefix_cache_hits_tokens),
        ("vllm:prompt_tokens_total", "counter", stats.prompt_tokens_total),
        ("vllm:generation_tokens_total", "counter", stats.generation_tokens_total),
        ("vllm:num_preemptions_total", "counter", stats.preemptions_total),
    ]
    lines = []
    for name, kind, value in rows:
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{label} {float(value)}")
    return ("\n".join(lines) + "\n").encode()
