"""Scraping the engines' Prometheus /metrics (vLLM names) during a run.

`EngineSampler` polls every engine every `interval_s`: running and waiting requests and KV usage become a
per-replica load time series; the prefix-cache counters (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`, in tokens) are read at the start of the measured window (after warm-up)
and at the end, and the hit ratio is the delta of hits over the delta of queries, summed over engines.
Given the gateway's URL (or the URLs of several gateway instances), the same two scrapes read its
rejection-latency histogram (`bench.gateway_rejections`), its failure-containment counters
(`bench.gateway_metrics`) and its request counter, summed over the instances (the request counter is also
kept per instance: `gateway_instances`); a window's gateway figures need every instance to answer both
scrapes, else they are unavailable rather than undercounted. With `watch_breakers` the gateway is also
read at every poll for its breaker states.
Series with several label sets (one per model) are summed. An engine that does not answer is skipped for
that sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.gateway_metrics import (
    BreakerLog,
    Counters,
    parse_breakers,
    parse_counters,
    parse_requests,
    sum_counters,
    summarize_gateway,
)
from bench.gateway_rejections import (
    Histograms,
    parse_rejection_histograms,
    sum_histograms,
    summarize_rejections,
)
from bench.stats import max_mean_ratio
from gateway.upstream.engine_metrics import ExpositionError, parse_exposition

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_WANTED = (RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage_ratio: float = 0.0
    prefix_queries_tokens: float = 0.0
    prefix_hits_tokens: float = 0.0

    @property
    def load(self) -> float:
        return self.running + self.waiting


def parse_metrics(text: str) -> EngineSnapshot:
    """Sum the wanted vLLM series over their label sets (the gateway's exposition parser; NaN and
    ±Inf samples are skipped). Text that is not a valid exposition reads as an empty snapshot."""
    try:
        samples = parse_exposition(text, _WANTED)
    except ExpositionError:
        return EngineSnapshot()
    totals = {name: sum(s.value for s in samples.get(name, ()) if math.isfinite(s.value)) for name in _WANTED}
    return EngineSnapshot(
        running=totals[RUNNING],
        waiting=totals[WAITING],
        kv_usage_ratio=totals[KV_USAGE],
        prefix_queries_tokens=totals[PREFIX_QUERIES],
        prefix_hits_tokens=totals[PREFIX_HITS],
    )


def prefix_hit_ratio(
    start: dict[str, EngineSnapshot], end: dict[str, EngineSnapshot]
) -> tuple[float | None, float, float]:
    """(hits ÷ queries, hits, queries) of the deltas between two scrapes, over engines in both."""
    hits = queries = 0.0
    for replica, last in end.items():
        first = start.get(replica)
        if first is None:
            continue
        hits += max(0.0, last.prefix_hits_tokens - first.prefix_hits_tokens)
        queries += max(0.0, last.prefix_queries_tokens - first.prefix_queries_tokens)
    return (hits / queries if queries > 0 else None), hits, queries


@dataclass(slots=True)
class LoadSeries:
    """Samples of (t_s, replica, snapshot), t_s from the run's start."""

    points: list[tuple[float, str, EngineSnapshot]] = field(default_factory=list)

    def replicas(self) -> list[str]:
        return sorted({replica for _, replica, _ in self.points})

    def mean_load(self, from_s: float = 0.0, to_s: float = float("inf")) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for t_s, replica, snap in self.points:
            if from_s <= t_s <= to_s:
                sums.setdefault(replica, []).append(snap.load)
        return {r: sum(v) / len(v) for r, v in sums.items()}

    def peak_load(self) -> dict[str, float]:
        peaks: dict[str, float] = {}
        for _, replica, snap in self.points:
            peaks[replica] = max(peaks.get(replica, 0.0), snap.load)
        return peaks


class EngineSampler:
    """Polls the engines in the background; `baseline()`/`finish()` bracket the measured window."""

    def __init__(
        self,
        engines: dict[str, str],
        interval_s: float = 0.5,
        gateway_urls: list[str] | tuple[str, ...] = (),
        watch_breakers: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.engines = engines  # replica id (host:port) → base URL
        self.interval_s = interval_s
        self.gateway_urls = [url.rstrip("/") for url in gateway_urls]
        self.start_rejections: Histograms | None = None
        self.end_rejections: Histograms | None = None
        self.start_gateway: Counters | None = None
        self.end_gateway: Counters | None = None
        self.start_requests: list[float | None] | None = None
        self.end_requests: list[float | None] | None = None
        self.breakers = BreakerLog() if watch_breakers and self.gateway_urls else None
        self.series = LoadSeries()
        self.start_counters: dict[str, EngineSnapshot] = {}
        self.end_counters: dict[str, EngineSnapshot] = {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(2.0), transport=transport)
        self._task: asyncio.Task[None] | None = None
        self._run_start = time.perf_counter()

    async def scrape(self) -> dict[str, EngineSnapshot]:
        results = await asyncio.gather(*(self._one(url) for url in self.engines.values()))
        return {r: s for r, s in zip(self.engines, results, strict=True) if s is not None}

    async def _one(self, url: str) -> EngineSnapshot | None:
        try:
            response = await self._http.get(url + "/metrics")
        except httpx.HTTPError:
            return None
        return parse_metrics(response.text) if response.status_code == 200 else None

    def start(self, run_start: float) -> None:
        self._run_start = run_start
        if self.engines and self._task is None:
            self._task = asyncio.create_task(self._poll())

    async def baseline(self) -> None:
        self.start_counters = await self.scrape()
        texts = await self._gateway_texts()
        if texts is not None:
            self.start_rejections, self.start_gateway, self.start_requests = _parse_gateways(texts)

    async def _gateway_texts(self) -> list[str] | None:
        """Every gateway instance's /metrics now; None when there is no gateway or one did not answer
        (then the window's figures are unavailable rather than counted from zero)."""
        if not self.gateway_urls:
            return None
        texts = await asyncio.gather(*(self._gateway_text(url) for url in self.gateway_urls))
        return None if any(text is None for text in texts) else [t for t in texts if t is not None]

    async def _gateway_text(self, url: str) -> str | None:
        try:
            response = await self._http.get(url + "/metrics")
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    async def finish(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.engines:
            self.end_counters = await self.scrape()
        texts = await self._gateway_texts()
        if texts is not None:
            self.end_rejections, self.end_gateway, self.end_requests = _parse_gateways(texts)
        await self._http.aclose()

    async def _poll(self) -> None:
        while True:
            t_s = time.perf_counter() - self._run_start
            for replica, snap in (await self.scrape()).items():
                self.series.points.append((t_s, replica, snap))
            if self.breakers is not None:
                texts = await self._gateway_texts()
                if texts is not None:
                    self.breakers.points.append((t_s, _breakers(texts)))
            await asyncio.sleep(self.interval_s)

    def summary(self, window_s: tuple[float, float]) -> dict[str, Any]:
        ratio, hits, queries = prefix_hit_ratio(self.start_counters, self.end_counters)
        mean = self.series.mean_load(*window_s)
        return {
            "prefix_cache_hit_ratio": ratio,
            "prefix_cache_hit_tokens": hits,
            "prefix_cache_query_tokens": queries,
            "mean_load_per_replica": mean,
            "peak_load_per_replica": self.series.peak_load(),
            "load_max_mean_ratio": max_mean_ratio(mean.values()),
            "samples": len(self.series.points),
            "gateway_rejections": (
                None
                if self.start_rejections is None or self.end_rejections is None
                else summarize_rejections(self.start_rejections, self.end_rejections)
            ),
            "gateway": summarize_gateway(
                self.start_gateway, self.end_gateway, self.breakers, window_s, self.interval_s
            ),
            "gateway_instances": self.instance_requests(),
        }

    def instance_requests(self) -> dict[str, int | None] | None:
        """Requests each gateway instance counted over the measured window (its URL → Δ
        `llm_gateway_requests_total`; None for an instance whose exposition did not parse)."""
        if self.start_requests is None or self.end_requests is None:
            return None
        out: dict[str, int | None] = {}
        for url, first, last in zip(self.gateway_urls, self.start_requests, self.end_requests, strict=True):
            out[url] = None if first is None or last is None else round(max(0.0, last - first))
        return out


def _parse_gateways(texts: list[str]) -> tuple[Histograms, Counters, list[float | None]]:
    """The instances' rejection histograms and containment counters, summed; their request counters."""
    histograms = sum_histograms([parse_rejection_histograms(text) for text in texts])
    counters = sum_counters([parse_counters(text) for text in texts])
    return histograms, counters, [parse_requests(text) for text in texts]


def _breakers(texts: list[str]) -> dict[str, float]:
    """Breaker states of one instance (keyed by replica) or of several (keyed `replica@j`)."""
    if len(texts) == 1:
        return parse_breakers(texts[0])
    states: dict[str, float] = {}
    for instance, text in enumerate(texts):
        states.update(parse_breakers(text, instance))
    return states
