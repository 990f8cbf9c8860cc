"""Concurrent SSE streams: how many long-lived streams a path sustains without stalls, and frames/s.

At each level N, N streams start together (same request, `tokens` output tokens paced by the engine's
token delay) and run to the end. A stream *stalls* when it fails or when any gap between two of its
frames after the first token exceeds `stall_s`; a level is sustained when no stream stalls. Frames/s is
every SSE data frame of the level divided by its wall time; compare it with the nominal rate (N × 1000 /
token delay ms) and the stream duration with its nominal (tokens × delay) to see a path that keeps
every stream alive but slows them all down.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.client import BenchClient, ClientOptions
from bench.rawsse import RawSseClient
from bench.sample import Sample
from bench.stats import Distribution
from bench.workload import RequestSpec


@dataclass(frozen=True, slots=True)
class StreamLevel:
    path: str
    streams: int
    ok: int
    stalled: int
    frames: int
    wall_s: float
    max_gap_ms: dict[str, float] | None
    ttft_ms: dict[str, float] | None
    e2e_ms: dict[str, float] | None = None
    failures: dict[str, int] = field(default_factory=dict)
    cpu_us_per_stream: dict[str, float | None] | None = None
    cpu_util: dict[str, float] = field(default_factory=dict)

    @property
    def sustained(self) -> bool:
        return self.stalled == 0 and self.ok == self.streams

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "streams": self.streams,
            "ok": self.ok,
            "stalled": self.stalled,
            "sustained": self.sustained,
            "frames": self.frames,
            "frames_per_s": self.frames_per_s,
            "wall_s": self.wall_s,
            "max_gap_ms": self.max_gap_ms,
            "ttft_ms": self.ttft_ms,
            "e2e_ms": self.e2e_ms,
            "failures": self.failures,
            "cpu_us_per_stream": self.cpu_us_per_stream,
            "cpu_util": self.cpu_util,
        }


def _ms(values: list[float]) -> dict[str, float] | None:
    dist = Distribution.of(values)
    if dist is None:
        return None
    scaled = dist.scaled(1000.0)
    return {"p50": scaled.p50, "p99": scaled.p99, "max": scaled.max}


Send = Callable[[str, RequestSpec, int, float], Awaitable[Sample]]
"""(url, spec, index, run_start) → sample: `BenchClient.send` or `rawsse.stream_once` bound to a model."""


def httpx_sender(client: BenchClient) -> Send:
    return lambda url, spec, index, start: client.send(url, spec, index, 0.0, start)


def raw_sender(model: str, timeout_s: float = 120.0) -> Send:
    client = RawSseClient(ClientOptions(model=model, timeout_s=timeout_s))
    return lambda url, spec, index, start: client.send(url, spec, index, 0.0, start)


async def stream_level(
    send: Send, path: str, url: str, spec: RequestSpec, *, streams: int, stall_s: float
) -> StreamLevel:
    start = time.perf_counter()
    samples = await asyncio.gather(*(send(url, spec, i, start) for i in range(streams)))
    wall_s = time.perf_counter() - start
    gaps = [s.max_gap_s for s in samples if s.max_gap_s is not None]
    stalled = sum(1 for s in samples if not s.ok or (s.max_gap_s or 0.0) > stall_s)
    return StreamLevel(
        path=path,
        streams=streams,
        ok=sum(1 for s in samples if s.ok),
        stalled=stalled,
        frames=sum(s.frames for s in samples),
        wall_s=wall_s,
        max_gap_ms=_ms(gaps),
        ttft_ms=_ms([s.ttft_s for s in samples if s.ttft_s is not None]),
        e2e_ms=_ms([s.e2e_s for s in samples if s.ok]),
        failures=dict(Counter(s.outcome for s in samples if not s.ok)),
    )
