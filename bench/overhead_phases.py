"""The interleaved phases of `bench overhead` that compare paths (direct, gateway, reference and floor
proxies) on the zero-delay engine: sequential latency rounds and closed-loop throughput blocks.

Every round sends to each path once, in an order that rotates by one each round, so every path sees the
same machine noise. A path's added latency is its percentile (p50, p99, mean) minus direct's. A
server's CPU per request is its /proc CPU time (utime + stime, and schedstat) over the measured rounds
÷ the requests it served; warm-up rounds (latency) and the first block per path (throughput) are not
measured. A failed latency request stops the run (RuntimeError); a failed request in a throughput
block is left out of its req/s.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from typing import Any

from bench.arrivals import ClosedLoop
from bench.client import BenchClient, Client
from bench.proc import CpuReading
from bench.runner import LoadPlan, run_load
from bench.sample import Sample
from bench.stats import Distribution
from bench.workload import RequestSpec


def _dist_ms(samples: list[Sample], attr: str) -> dict[str, float] | None:
    dist = Distribution.of([v for s in samples if (v := getattr(s, attr)) is not None])
    return None if dist is None else {"p50": dist.p50 * 1e3, "p99": dist.p99 * 1e3, "mean": dist.mean * 1e3}


def _added(via: dict[str, float] | None, direct: dict[str, float] | None) -> dict[str, float] | None:
    return {k: via[k] - direct[k] for k in ("p50", "p99", "mean")} if via and direct else None


def _latencies(got: dict[str, list[Sample]]) -> dict[str, Any]:
    """Per metric: each path's distribution, and each server's added percentiles over direct."""
    result: dict[str, Any] = {}
    for attr in ("e2e_s", "ttft_s"):
        entry: dict[str, Any] = {path: _dist_ms(samples, attr) for path, samples in got.items()}
        entry["added"] = _added(entry.get("gateway"), entry.get("direct"))
        for server in got.keys() - {"direct", "gateway"}:
            entry[f"added_{server}"] = _added(entry.get(server), entry.get("direct"))
        result[attr.removesuffix("_s") + "_ms"] = entry
    return result


def _rotated(paths: list[str], n: int) -> list[str]:
    shift = n % len(paths)
    return [*paths[shift:], *paths[:shift]]


async def latency_pairs(
    client: BenchClient,
    urls: dict[str, str],
    spec: RequestSpec,
    *,
    requests: int,
    warmup: int,
    pids: dict[str, int],
) -> dict[str, Any]:
    """Sequential rounds, one request per path (order rotating); each server's CPU over the measured
    rounds (`pids`: server name → pid)."""
    paths = list(urls)
    got: dict[str, list[Sample]] = {path: [] for path in paths}
    start = time.perf_counter()
    readings = {name: CpuReading.of(pid) for name, pid in pids.items()}
    for i in range(warmup + requests):
        if i == warmup:
            readings = {name: CpuReading.of(pid) for name, pid in pids.items()}
        for path in _rotated(paths, i):
            sample = await client.send(urls[path], spec, i, 0.0, start)
            if not sample.ok:
                raise RuntimeError(f"{path} request failed: {sample.outcome} (status {sample.status})")
            if i >= warmup:
                got[path].append(sample)
    result: dict[str, Any] = {"requests": requests}
    for name, pid in pids.items():
        result[f"{name}_cpu_us_per_request"] = readings[name].per_request_us(CpuReading.of(pid), requests)
    return result | _latencies(got)


def _fixed(url: str) -> Callable[[RequestSpec], str]:
    return lambda _spec: url


async def throughput_blocks(
    client: Client,
    urls: dict[str, str],
    spec: RequestSpec,
    args: argparse.Namespace,
    *,
    pids: dict[str, int],
    blocks: int | None = None,
) -> dict[str, Any]:
    """One unmeasured block per path, then `blocks` rounds of one closed-loop block per path (order
    rotating); req/s per path, each server's CPU per request and the added latency under load."""
    paths = list(urls)
    rates: dict[str, list[float]] = {path: [] for path in paths}
    cpu: dict[str, list[dict[str, float | None]]] = {name: [] for name in pids}
    got: dict[str, list[Sample]] = {path: [] for path in paths}
    plan = LoadPlan(ClosedLoop(args.throughput_concurrency), duration_s=args.throughput_block_s)
    rounds = args.throughput_blocks if blocks is None else blocks
    order = paths + [path for n in range(rounds) for path in _rotated(paths, n)]
    for n, path in enumerate(order):
        before = {name: CpuReading.of(pid) for name, pid in pids.items()}
        record = await run_load(plan, itertools.repeat(spec), client, _fixed(urls[path]))
        ok = [s for s in record.samples if s.ok]
        if n < len(paths):
            continue
        rates[path].append(len(ok) / record.wall_s)
        got[path] += ok
        if path in pids:
            cpu[path].append(before[path].per_request_us(CpuReading.of(pids[path]), len(ok)))
    mean = {path: sum(rates[path]) / len(rates[path]) for path in paths}
    result: dict[str, Any] = {"concurrency": args.throughput_concurrency, "blocks": rates}
    for path in paths:
        result[f"{path}_rps"] = mean[path]
        if path != "direct":
            key = "ratio" if path == "gateway" else f"{path}_ratio"
            result[key] = mean[path] / mean["direct"] if mean["direct"] else None
    for name in pids:
        result[f"{name}_cpu_us_per_request"] = cpu[name]
    return result | _latencies(got)
