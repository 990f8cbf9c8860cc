"""Prometheus text for the mock engine, with the metric names of the engine flavour it imitates.

`render_metrics(model, stats, flavour="vllm")`; `FLAVOURS` lists the flavours. Each flavour uses the real
engine's names, labels, HELP text and number style (sources below); only metrics the mock's `EngineStats`
can fill are rendered. The one histogram is the inter-token latency (vLLM and SGLang name it
`…:inter_token_latency_seconds`), rendered with its `+Inf` bucket, `_sum` and `_count` only: the stats
carry the gaps' sum and count, not their distribution (the server passes the sum in wall seconds).

- vllm — vllm-project/vllm, vllm/v1/metrics/loggers.py: labels `model_name`, `engine`; counters with
  `_total` as prometheus_client exposes them; `vllm:kv_cache_usage_perc` is a fraction (0..1). With LoRA
  enabled, `vllm:lora_requests_info` (`LoraRequestsInfo`).
- sglang — sgl-project/sglang, python/sglang/srt/metrics/collector.py: label `model_name`;
  `sglang:token_usage` is the KV pool usage, `sglang:cache_hit_rate` the prefix hit rate (rendered as
  cumulative hits / queries, 0.0 before any query); `sglang:cached_tokens_total` the cached prompt tokens.
- tgi — huggingface/text-generation-inference, backends/v3/src/queue.rs and backend.rs: unlabelled
  gauges `tgi_queue_size`, `tgi_batch_current_size` (TGI exports no KV or prefix-cache metric).
- llamacpp — ggml-org/llama.cpp, tools/server/server-task.cpp: unlabelled; `prompt_tokens_total` excludes
  cached tokens (rendered as queried − hit tokens), `prompt_tokens_cached_total` the hits;
  `kv_cache_usage_ratio` as older builds (examples/server/server.cpp) exported it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mock_engine.core import EngineStats

LORA_INFO_SERIES_KEPT = 64

# (name, type, help, value)
_Row = tuple[str, str, str, float]


def _hit_ratio(stats: EngineStats) -> float:
    queries = stats.prefix_cache_queries_tokens
    return stats.prefix_cache_hits_tokens / queries if queries > 0 else 0.0


def _vllm(stats: EngineStats) -> list[_Row]:
    return [
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            stats.running,
        ),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", stats.waiting),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            stats.kv_usage_ratio,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries_tokens,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits_tokens,
        ),
        (
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            stats.preemptions_total,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            stats.prompt_tokens_total,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            stats.generation_tokens_total,
        ),
    ]


def _sglang(stats: EngineStats) -> list[_Row]:
    return [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", stats.running),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", stats.waiting),
        ("sglang:token_usage", "gauge", "The token usage.", stats.kv_usage_ratio),
        ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", _hit_ratio(stats)),
        (
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            stats.prompt_tokens_total,
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            stats.generation_tokens_total,
        ),
        (
            "sglang:cached_tokens_total",
            "counter",
            "Number of cached prompt tokens.",
            stats.prefix_cache_hits_tokens,
        ),
    ]


def _tgi(stats: EngineStats) -> list[_Row]:
    return [
        ("tgi_batch_current_size", "gauge", "Current batch size", stats.running),
        ("tgi_queue_size", "gauge", "Current queue size", stats.waiting),
    ]


def _llamacpp(stats: EngineStats) -> list[_Row]:
    uncached = max(0, stats.prefix_cache_queries_tokens - stats.prefix_cache_hits_tokens)
    return [
        (
            "llamacpp:prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed, excluding cached tokens",
            uncached,
        ),
        (
            "llamacpp:prompt_tokens_cached_total",
            "counter",
            "Number of prompt tokens reused from the cache",
            stats.prefix_cache_hits_tokens,
        ),
        (
            "llamacpp:tokens_predicted_total",
            "counter",
            "Number of generation tokens processed",
            stats.generation_tokens_total,
        ),
        ("llamacpp:requests_processing", "gauge", "Number of requests processing", stats.running),
        ("llamacpp:requests_deferred", "gauge", "Number of requests deferred", stats.waiting),
        (
            "llamacpp:kv_cache_usage_ratio",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            stats.kv_usage_ratio,
        ),
    ]


# flavour → (name, help) of its inter-token latency histogram
_INTER_TOKEN: dict[str, tuple[str, str]] = {
    "vllm": ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    "sglang": ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
}


def _histogram_lines(
    name: str, help_text: str, labels: str, *, total_s: float, count: int, number: Callable[[float], str]
) -> list[str]:
    """A histogram with only its `+Inf` bucket (module docstring), `labels` merged with `le`."""
    bucket_labels = f'{{{labels[1:-1]},le="+Inf"}}' if labels else '{le="+Inf"}'
    return [
        f"# HELP {name} {help_text}",
        f"# TYPE {name} histogram",
        f"{name}_sum{labels} {number(total_s)}",
        f"{name}_bucket{bucket_labels} {number(count)}",
        f"{name}_count{labels} {number(count)}",
    ]


def _escape(label_value: str) -> str:
    return label_value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _python_number(value: float) -> str:
    """prometheus_client style (vLLM, SGLang; its `floatToGoString`): a float, `7.0`, with Go's exponent
    from 10^6 up for positive values (`1.7e+09`)."""
    number = float(value)
    if math.isinf(number) or math.isnan(number):
        return "NaN" if math.isnan(number) else ("+Inf" if number > 0 else "-Inf")
    text = repr(number)
    dot = text.find(".")
    if number > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


class LoraRequestsInfo:
    """vLLM's `vllm:lora_requests_info` gauge (vllm/v1/metrics/loggers.py): one series per label set
    `max_lora` (the engine's `--max-loras`), `waiting_lora_adapters`, `running_lora_adapters` (the
    adapters' names joined with ","), whose value is the Unix time (seconds) it was last the engine's
    state — prometheus_client's `set_to_current_time()`. vLLM never drops a label set it has exported,
    so a reader takes the series with the largest value as the current state.

    `sample(stats, now_s)` makes the current state's series `now_s` (the server does it at each scrape,
    so the latest series is the state at the scrape; vLLM sets it at each engine step, so an idle vLLM
    still shows its last busy step as the latest). The oldest series beyond `LORA_INFO_SERIES_KEPT` are
    dropped (vLLM keeps every one).
    """

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self._series: dict[tuple[str, str], float] = {}

    def sample(self, stats: EngineStats, now_s: float) -> None:
        key = (",".join(stats.waiting_adapters), ",".join(stats.running_adapters))
        self._series[key] = now_s
        while len(self._series) > LORA_INFO_SERIES_KEPT:
            del self._series[min(self._series, key=self._series.__getitem__)]

    def lines(self) -> list[str]:
        """The family's exposition lines, series in the order first seen (as prometheus_client)."""
        out = [
            "# HELP vllm:lora_requests_info Running stats on lora requests.",
            "# TYPE vllm:lora_requests_info gauge",
        ]
        for (waiting, running), time_s in self._series.items():
            labels = (
                f'max_lora="{self.max_loras}",waiting_lora_adapters="{_escape(waiting)}",'
                f'running_lora_adapters="{_escape(running)}"'
            )
            out.append(f"vllm:lora_requests_info{{{labels}}} {_python_number(time_s)}")
        return out


def _compact_number(value: float) -> str:
    """Rust metrics-exporter / C++ stream style (TGI, llama.cpp): integral values without `.0`."""
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


# flavour → (rows, labels for a model name, number style)
_FLAVOURS: dict[
    str, tuple[Callable[[EngineStats], list[_Row]], Callable[[str], str], Callable[[float], str]]
] = {
    "vllm": (_vllm, lambda model: f'{{engine="0",model_name="{_escape(model)}"}}', _python_number),
    "sglang": (_sglang, lambda model: f'{{model_name="{_escape(model)}"}}', _python_number),
    "tgi": (_tgi, lambda model: "", _compact_number),
    "llamacpp": (_llamacpp, lambda model: "", _compact_number),
}

FLAVOURS: tuple[str, ...] = tuple(_FLAVOURS)


def render_metrics(
    model: str, stats: EngineStats, *, flavour: str = "vllm", lora: LoraRequestsInfo | None = None
) -> bytes:
    """The /metrics body for `stats` in `flavour`'s names, with `lora`'s series in the vLLM flavour (the
    other engines export no LoRA metric); `ValueError` for an unknown flavour."""
    try:
        rows_of, labels_of, number = _FLAVOURS[flavour]
    except KeyError:
        raise ValueError(f"unknown metrics flavour {flavour!r}; known: {', '.join(FLAVOURS)}") from None
    labels = labels_of(model)
    lines: list[str] = []
    for name, kind, help_text, value in rows_of(stats):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {number(value)}")
    histogram = _INTER_TOKEN.get(flavour)
    if histogram is not None:
        name, help_text = histogram
        total_s, count = stats.inter_token_latency_sum_s, stats.inter_token_latency_count
        lines.extend(_histogram_lines(name, help_text, labels, total_s=total_s, count=count, number=number))
    if lora is not None and flavour == "vllm":
        lines.extend(lora.lines())
    return ("\n".join(lines) + "\n").encode()
