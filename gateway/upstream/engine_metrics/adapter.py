"""A metrics adapter maps one engine flavour's /metrics names onto an `EngineSample`.

Adapters are data, not code paths: a `FlavourSpec` lists, per field, the candidate metric names (first
present wins, so a renamed metric keeps working across engine versions), and `SpecAdapter` applies one
documented set of rules to every flavour:

- Label sets. An engine may expose several label sets per metric: data-parallel ranks (vLLM's `engine`,
  SGLang's `dp_rank`), or several served models. When `model` is given and the flavour has a model label,
  only the label sets whose model label equals `model` are used; if none match (the engine serves the
  model under another name) all label sets are used. The remaining sets are then combined: counts
  (running, waiting, counters) are summed, ratios (KV usage, hit-rate gauges) averaged — with equally
  sized ranks the mean is the pooled usage.
- Non-finite values. A NaN or ±Inf sample is "no value": it is dropped before combining; a metric whose
  every sample is dropped counts as absent.
- Ranges. Counts are clamped at 0 and ratios to [0, 1], so float noise (1.0000001, -0.0) or a negative
  gauge never reaches the scorers.
- Missing metrics. `running` and `waiting` are required: without them the sample is useless for routing
  and `EngineMetricsError(MISSING_METRICS)` is raised (typically a flavour mismatch, e.g. `vllm`
  configured in front of SGLang). KV usage and prefix-cache hit ratio are optional (None when absent).
- Prefix-cache hit ratio. A hit-rate gauge wins when present. Otherwise a counter pair is used, over a
  window of at least `MIN_WINDOW_QUERY_TOKENS` queried tokens: Δhits / Δqueries since the window opened,
  reported when the window closes (it then reopens at the current counters); while the open window holds
  fewer tokens the last closed window's ratio is carried over (an idle interval changes nothing). Why a
  token minimum rather than the last scrape interval: engines do not bump both counters at once —
  llama.cpp adds a request's cached tokens when it starts and its processed tokens when its prefill ends,
  so an interval that holds only the 8-token tail of a full hit read 0 % and that 0 % was carried over
  until the next request. On the first sample, or after a counter reset (an engine restart: a counter
  went down), the cumulative hits / queries; None while the engine has never been queried.
- Token latency. From an inter-token latency histogram (`token_latency` names, read as `<name>_sum` in
  seconds and `<name>_count` gaps): Δsum / Δcount over a window of at least `MIN_WINDOW_TOKEN_GAPS`
  gaps, reported only by the sample whose scrape closed the window (it then reopens at the current
  counters) — None in every other sample, so each closed window reaches the batch budget once
  (`gateway.upstream.batch_budget`). It is the engine's own mean time between a sequence's tokens over
  the window, whoever sent the requests: every gateway instance reads the same figure. None before the
  first window, after a counter reset (the window reopens), or when the flavour exports no histogram.
- Malformed text raises `EngineMetricsError(PARSE)` (see `exposition` for what counts as malformed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.upstream.engine_metrics.counter_windows import (
    HitCounters,
    TokenWindow,
    clamp_ratio,
    counter_ratio,
    token_window,
)
from gateway.upstream.engine_metrics.exposition import (
    Exposition,
    ExpositionError,
    Sample,
    parse_exposition,
)
from gateway.upstream.engine_metrics.sample import EngineMetricsError, EngineSample, ScrapeErrorReason


class MetricsAdapter(Protocol):
    """What the scraper needs from an adapter."""

    @property
    def flavour(self) -> str: ...

    @property
    def exports_lora(self) -> bool:
        """The flavour reports its LoRA adapters (vLLM's `vllm:lora_requests_info`)."""
        ...

    def sample(
        self,
        text: str,
        *,
        taken_at_s: float,
        previous: EngineSample | None = None,
        model: str | None = None,
    ) -> EngineSample:
        """Read one exposition; raises `EngineMetricsError` when it yields no usable sample."""
        ...


@dataclass(frozen=True, slots=True)
class CounterPair:
    """Prefix-cache counters in tokens: hits = sum of `hits` names, queries = sum of `queries` names."""

    hits: tuple[str, ...]
    queries: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FlavourSpec:
    """Which names one engine flavour exports for each `EngineSample` field (candidates in order)."""

    flavour: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()
    hit_ratio_gauges: tuple[str, ...] = ()
    hit_counters: tuple[CounterPair, ...] = ()
    model_label: str | None = "model_name"
    lora_info: tuple[str, ...] = ()
    token_latency: tuple[str, ...] = ()
    """Inter-token latency histograms (base names, newest first); read as `_sum` and `_count`."""
    wanted: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        names = {*self.running, *self.waiting, *self.kv_usage, *self.hit_ratio_gauges, *self.lora_info}
        names.update(f"{name}{part}" for name in self.token_latency for part in ("_sum", "_count"))
        for pair in self.hit_counters:
            names.update(pair.hits)
            names.update(pair.queries)
        object.__setattr__(self, "wanted", frozenset(names))


def lora_adapters(
    exposition: Exposition, names: Sequence[str]
) -> tuple[frozenset[str], frozenset[str], int | None]:
    """The LoRA adapters with running and with waiting requests, and `max_lora`, from vLLM's info gauge:
    its labels `running_lora_adapters` / `waiting_lora_adapters` hold comma-joined names and its value is
    the time the label set was last set, so the newest label set (largest finite value) is the current
    one — older sets stay exposed. Empty sets and None when the gauge is absent."""
    for name in names:
        samples = [s for s in exposition.get(name, []) if math.isfinite(s.value)]
        if samples:
            newest = max(samples, key=lambda s: s.value).labels
            max_lora = newest.get("max_lora", "")
            slots = int(max_lora) if max_lora.isdigit() and int(max_lora) > 0 else None
            return _names(newest, "running_lora_adapters"), _names(newest, "waiting_lora_adapters"), slots
    return frozenset(), frozenset(), None


def _names(labels: dict[str, str], label: str) -> frozenset[str]:
    """The comma-joined names of `label` (empty when absent)."""
    return frozenset(part for part in labels.get(label, "").split(",") if part)


def _clamp_count(value: float) -> float:
    return max(0.0, value)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class SpecAdapter:
    """The one adapter implementation, configured by a `FlavourSpec` (rules in the module docstring)."""

    def __init__(self, spec: FlavourSpec) -> None:
        self.spec = spec

    @property
    def flavour(self) -> str:
        return self.spec.flavour

    @property
    def exports_lora(self) -> bool:
        return bool(self.spec.lora_info)

    def sample(
        self,
        text: str,
        *,
        taken_at_s: float,
        previous: EngineSample | None = None,
        model: str | None = None,
    ) -> EngineSample:
        try:
            exposition = parse_exposition(text, self.spec.wanted)
        except ExpositionError as exc:
            raise EngineMetricsError(ScrapeErrorReason.PARSE, str(exc)) from None
        read = _Reader(exposition, self.spec.model_label, model)
        running = read.first(self.spec.running, sum)
        waiting = read.first(self.spec.waiting, sum)
        if running is None or waiting is None:
            fields = ((self.spec.running, running), (self.spec.waiting, waiting))
            absent = ", ".join(" or ".join(names) for names, value in fields if value is None)
            raise EngineMetricsError(
                ScrapeErrorReason.MISSING_METRICS, f"{self.flavour}: no finite value for {absent}"
            )
        kv = read.first(self.spec.kv_usage, _mean)
        ratio, window = self._hit_ratio(read, previous)
        running_adapters, waiting_adapters, max_loras = lora_adapters(exposition, self.spec.lora_info)
        tokens = self._token_window(read, previous)
        return EngineSample(
            running=_clamp_count(running),
            waiting=_clamp_count(waiting),
            kv_usage_ratio=None if kv is None else clamp_ratio(kv),
            prefix_cache_hit_ratio=ratio,
            taken_at_s=taken_at_s,
            prefix_cache_window_hits_tokens=window.window_hits_tokens if window else None,
            prefix_cache_window_queries_tokens=window.window_queries_tokens if window else None,
            running_adapters=running_adapters,
            waiting_adapters=waiting_adapters,
            max_loras=max_loras,
            token_latency_s=tokens.latency_s if tokens else None,
            token_window_sum_s=tokens.start_sum_s if tokens else None,
            token_window_count=tokens.start_count if tokens else None,
        )

    def _token_window(self, read: _Reader, previous: EngineSample | None) -> TokenWindow | None:
        for name in self.spec.token_latency:
            total_s, count = read.total((f"{name}_sum",)), read.total((f"{name}_count",))
            if total_s is not None and count is not None:
                return token_window(previous, total_s, count)
        return None

    def _hit_ratio(
        self, read: _Reader, previous: EngineSample | None
    ) -> tuple[float | None, HitCounters | None]:
        gauge = read.first(self.spec.hit_ratio_gauges, _mean)
        if gauge is not None:
            return clamp_ratio(gauge), None
        for pair in self.spec.hit_counters:
            hits = read.total(pair.hits)
            queries = read.total(pair.queries)
            if hits is not None and queries is not None:
                window = counter_ratio(previous, hits, queries)
                return window.ratio, window
        return None, None


class _Reader:
    """Looks metrics up in one exposition, applying the label-set and non-finite rules."""

    def __init__(self, exposition: Exposition, model_label: str | None, model: str | None) -> None:
        self._exposition = exposition
        self._model_label = model_label
        self._model = model

    def values(self, name: str) -> list[float]:
        """Finite values of `name` over the selected label sets (empty when absent)."""
        samples: list[Sample] = self._exposition.get(name, [])
        if self._model_label is not None and self._model is not None:
            label, model = self._model_label, self._model
            matching = [s for s in samples if s.labels.get(label) == model]
            samples = matching or samples
        return [s.value for s in samples if math.isfinite(s.value)]

    def first(self, names: Sequence[str], combine: Callable[[Sequence[float]], float]) -> float | None:
        """The first name in `names` with a finite value, its label sets combined; None if none has."""
        for name in names:
            values = self.values(name)
            if values:
                return combine(values)
        return None

    def total(self, names: Sequence[str]) -> float | None:
        """The sum over `names` (each summed over label sets); None unless every name has a value."""
        parts = [self.values(name) for name in names]
        if not all(parts):
            return None
        return _clamp_count(sum(sum(part) for part in parts))
