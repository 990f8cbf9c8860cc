"""Scraping the engines' Prometheus /metrics (vLLM names) during a run.

`EngineSampler` polls every engine every `interval_s`: running and waiting requests and KV usage become a
per-replica load time series; the prefix-cache counters (`vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total`, in tokens) are read at the start of the measured window (after warm-up)
and at the end, and the hit ratio is the delta of hits over the delta of queries, summed over engines.
Given the gateway's URL, the same two scrapes read its rejection-latency histogram
(`bench.gateway_rejections`) and its failure-containment counters (`bench.gateway_metrics`), and with
`watch_breakers` the gateway is also read at every poll for its breaker states.
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

from bench.gateway_metrics import BreakerLog, Counters, parse_breakers, parse_counters, summarize_gateway
from bench.gateway_rejections import Histograms, parse_rejection_histograms, summarize_rejections
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
        gateway_url: str | None = None,
        watch_breakers: bool = False,
    ) -> None:
        self.engines = engines  # replica id (host:port) → base URL
        self.interval_s = interval_s
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.start_rejections: Histograms | None = None
        self.end_rejections: Histograms | None = None
        self.start_gateway: Counters | None = None
        self.end_gateway: Counters | None = None
        self.breakers = BreakerLog() if watch_breakers and self.gateway_url else None
        self.series = LoadSeries()
        self.start_counters: dict[str, EngineSnapshot] = {}
        self.end_counters: dict[str, EngineSnapshot] = {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(2.0))
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
        text = await self._gateway_text()
        if text is not None:
            self.start_rejections, self.start_gateway = parse_rejection_histograms(text), parse_counters(text)

    async def _gateway_text(self) -> str | None:
        """The gateway's /metrics now; None when there is no gateway or it did not answer (then the
        window's figures are unavailable rather than counted from zero)."""
        if self.gateway_url is None:
            return None
        try:
            response = await self._http.get(self.gateway_url + "/metrics")
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
        text = await self._gateway_text()
        if text is not None:
            self.end_rejections, self.end_gateway = parse_rejection_histograms(text), parse_counters(text)
        await self._http.aclose()

    async def _poll(self) -> None:
        while True:
            t_s = time.perf_counter() - self._run_start
            for replica, snap in (await self.scrape()).items():
                self.series.points.append((t_s, replica, snap))
            if self.breakers is not None:
                text = await self._gateway_text()
                if text is not None:
                    self.breakers.points.append((t_s, parse_breakers(text)))
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
        }
