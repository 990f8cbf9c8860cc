"""Engine /metrics → one flavour-neutral `EngineSample`: a strict Prometheus text parser and one adapter
per engine flavour (vllm, sglang, tgi, llamacpp), registered by flavour name. `openai` is not scraped.
"""

from gateway.upstream.engine_metrics.adapter import CounterPair, FlavourSpec, MetricsAdapter, SpecAdapter
from gateway.upstream.engine_metrics.exposition import ExpositionError, Sample, parse_exposition
from gateway.upstream.engine_metrics.flavours import (
    ADAPTERS,
    NOT_SCRAPED_FLAVOURS,
    adapter_for,
    known_flavours,
)
from gateway.upstream.engine_metrics.sample import EngineMetricsError, EngineSample, ScrapeErrorReason

__all__ = [
    "ADAPTERS",
    "NOT_SCRAPED_FLAVOURS",
    "CounterPair",
    "EngineMetricsError",
    "EngineSample",
    "ExpositionError",
    "FlavourSpec",
    "MetricsAdapter",
    "Sample",
    "ScrapeErrorReason",
    "SpecAdapter",
    "adapter_for",
    "known_flavours",
    "parse_exposition",
]
