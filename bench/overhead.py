"""`bench overhead`: what the gateway adds. The same client sends the same request to the same engine,
directly and through the gateway, interleaved, so both paths see the same machine noise.

Processes: a zero-delay mock engine (latency and throughput), a paced one (`--stream-token-delay-ms`,
for long-lived streams) and the gateway with one pool for each. With `--pin` (or `--pin-gateway CPU
--pin-others CPU`) the gateway runs on one core and the client and engines on the other.

Phases:
1. latency at concurrency 1, non-streamed then streamed (`--stream-tokens` chunks): `--requests` pairs,
   each pair direct + gateway in alternating order; added = gateway percentile − direct percentile.
   The gateway's CPU time (/proc/<pid>/stat utime + stime, and schedstat) over the phase ÷ its requests.
2. max req/s: closed loop at `--throughput-concurrency`, alternating direct and gateway blocks of
   `--throughput-block-s` (`--throughput-blocks` each), non-streamed; ratio gateway ÷ direct.
3. concurrent streams: at each of `--stream-levels`, N streams at once, direct then gateway, sent by
   `--stream-client` (`raw`, a bare-asyncio SSE client, by default: with hundreds of streams on one
   core httpx's pool bookkeeping, not the gateway, would set the limit); the
   largest N sustained without stalls (no failure, no gap over `--stall-ms`) and frames/s, with the CPU
   use (share of one core) of the gateway, the paced engine and the client during each level.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.arrivals import ClosedLoop
from bench.client import BenchClient, ClientOptions
from bench.fleet import EngineOptions, Fleet, GatewayOptions, Pinning, pin_self
from bench.overhead_report import render_overhead, write_overhead
from bench.proc import CpuReading
from bench.report import environment, output_dir
from bench.runner import LoadPlan, run_load
from bench.sample import Sample
from bench.stats import Distribution
from bench.streams import StreamLevel, httpx_sender, raw_sender, stream_level
from bench.workload import RequestSpec

FAST_MODEL = "bench-fast"
STREAM_MODEL = "bench-stream"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=200, help="measured pairs per latency phase")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured pairs first")
    parser.add_argument("--max-tokens", type=int, default=8, help="non-streamed output tokens")
    parser.add_argument("--stream-tokens", type=int, default=32, help="tokens per stream (~33 chunks)")
    parser.add_argument("--throughput-concurrency", type=int, default=32)
    parser.add_argument("--throughput-block-s", type=float, default=2.0)
    parser.add_argument("--throughput-blocks", type=int, default=2, help="blocks per path")
    parser.add_argument("--stream-levels", type=int, nargs="*", default=[64, 128, 256, 512])
    parser.add_argument("--stream-token-delay-ms", type=float, default=50.0)
    parser.add_argument("--stall-ms", type=float, default=1000.0)
    parser.add_argument(
        "--stream-client",
        choices=("raw", "httpx"),
        default="raw",
        help="client of the many-streams phase (raw: bare asyncio, cheap per stream; default raw)",
    )
    parser.add_argument("--pin", action="store_true", help="= --pin-gateway 0 --pin-others 1")
    parser.add_argument("--pin-gateway", type=int, default=None, metavar="CPU")
    parser.add_argument("--pin-others", type=int, default=None, metavar="CPU")
    parser.add_argument("--gateway-config", default=None, help="gateway YAML template")
    parser.add_argument("--out", default=None, help="output directory (default bench/results/…)")
    parser.add_argument("--quiet", action="store_true")


def _dist_ms(samples: list[Sample], attr: str) -> dict[str, float] | None:
    dist = Distribution.of([v for s in samples if (v := getattr(s, attr)) is not None])
    return None if dist is None else {"p50": dist.p50 * 1e3, "p99": dist.p99 * 1e3, "mean": dist.mean * 1e3}


async def latency_pairs(
    client: BenchClient, urls: dict[str, str], spec: RequestSpec, *, requests: int, warmup: int, pid: int
) -> dict[str, Any]:
    """Sequential pairs (order alternating), gateway CPU over the measured pairs."""
    got: dict[str, list[Sample]] = {"direct": [], "gateway": []}
    start = time.perf_counter()
    reading = CpuReading.of(pid)
    for i in range(warmup + requests):
        if i == warmup:
            reading = CpuReading.of(pid)
        for path in ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct"):
            sample = await client.send(urls[path], spec, i, 0.0, start)
            if not sample.ok:
                raise RuntimeError(f"{path} request failed: {sample.outcome} (status {sample.status})")
            if i >= warmup:
                got[path].append(sample)
    cpu = reading.per_request_us(CpuReading.of(pid), requests)
    result: dict[str, Any] = {"requests": requests, "gateway_cpu_us_per_request": cpu}
    for attr in ("e2e_s", "ttft_s"):
        name = attr.removesuffix("_s") + "_ms"
        direct, via = _dist_ms(got["direct"], attr), _dist_ms(got["gateway"], attr)
        added = None
        if direct and via:
            added = {k: via[k] - direct[k] for k in ("p50", "p99", "mean")}
        result[name] = {"direct": direct, "gateway": via, "added": added}
    return result


def _fixed(url: str) -> Callable[[RequestSpec], str]:
    return lambda _spec: url


async def throughput_blocks(
    client: BenchClient, urls: dict[str, str], spec: RequestSpec, args: argparse.Namespace, pid: int
) -> dict[str, Any]:
    """Alternating closed-loop blocks; req/s per path, gateway CPU per request under load."""
    rates: dict[str, list[float]] = {"direct": [], "gateway": []}
    cpu: list[dict[str, float | None]] = []
    plan = LoadPlan(ClosedLoop(args.throughput_concurrency), duration_s=args.throughput_block_s)
    order = ["gateway", "direct"] + ["direct", "gateway"] * args.throughput_blocks  # first two warm up
    for n, path in enumerate(order):
        url = urls[path]
        before = CpuReading.of(pid)
        record = await run_load(plan, itertools.repeat(spec), client, _fixed(url))
        ok = [s for s in record.samples if s.ok]
        if n < 2:
            continue
        rates[path].append(len(ok) / record.wall_s)
        if path == "gateway":
            cpu.append(before.per_request_us(CpuReading.of(pid), len(ok)))
    direct = sum(rates["direct"]) / len(rates["direct"])
    via = sum(rates["gateway"]) / len(rates["gateway"])
    return {
        "concurrency": args.throughput_concurrency,
        "direct_rps": direct,
        "gateway_rps": via,
        "ratio": via / direct if direct else None,
        "blocks": rates,
        "gateway_cpu_us_per_request": cpu,
    }


async def stream_levels(
    args: argparse.Namespace, urls: dict[str, str], pids: dict[str, int]
) -> list[StreamLevel]:
    """Each level direct then through the gateway; CPU use of gateway, engine and client per level."""
    pid = pids["gateway"]
    client = BenchClient(ClientOptions(model=STREAM_MODEL, stream=True, timeout_s=120.0))
    send = raw_sender(STREAM_MODEL) if args.stream_client == "raw" else httpx_sender(client)
    spec = RequestSpec(messages=(("user", "stream please"),), max_tokens=args.stream_tokens)
    levels: list[StreamLevel] = []
    try:
        await stream_level(send, "warmup", urls["direct"], spec, streams=8, stall_s=args.stall_ms / 1e3)
        for n in args.stream_levels:
            for path in ("direct", "gateway"):
                before = CpuReading.of(pid)
                readings = {name: CpuReading.of(p) for name, p in pids.items()}
                level = await stream_level(
                    send, path, urls[path], spec, streams=n, stall_s=args.stall_ms / 1e3
                )
                util = {
                    name: (CpuReading.of(p).sched_ns - readings[name].sched_ns) / 1e9 / level.wall_s
                    for name, p in pids.items()
                }
                level = replace(level, cpu_util=util)
                if path == "gateway":
                    cpu = before.per_request_us(CpuReading.of(pid), n)
                    level = replace(level, cpu_us_per_stream=cpu)
                levels.append(level)
                if not args.quiet:
                    print(
                        f"streams {path} {n}: {level.ok}/{n} ok, {level.stalled} stalled, "
                        f"{level.frames_per_s:.0f} frames/s",
                        file=sys.stderr,
                    )
    finally:
        await client.aclose()
    return levels


async def measure(
    args: argparse.Namespace, fast: dict[str, str], paced: dict[str, str], pids: dict[str, int]
) -> dict[str, Any]:
    pid = pids["gateway"]
    nonstream = BenchClient(ClientOptions(model=FAST_MODEL, stream=False, timeout_s=30.0))
    stream = BenchClient(ClientOptions(model=FAST_MODEL, stream=True, timeout_s=30.0))
    ping = RequestSpec(messages=(("user", "ping"),), max_tokens=args.max_tokens)
    chunks = RequestSpec(messages=(("user", "ping"),), max_tokens=args.stream_tokens)
    result: dict[str, Any] = {}
    try:

        def say(message: str) -> None:
            if not args.quiet:
                print(message, file=sys.stderr)

        say("overhead: latency, non-streamed …")
        result["latency"] = await latency_pairs(
            nonstream, fast, ping, requests=args.requests, warmup=args.warmup, pid=pid
        )
        say("overhead: latency, streamed …")
        result["stream_latency"] = await latency_pairs(
            stream, fast, chunks, requests=args.requests, warmup=args.warmup, pid=pid
        )
        say("overhead: max req/s …")
        if args.throughput_blocks > 0:
            result["throughput"] = await throughput_blocks(nonstream, fast, ping, args, pid)
    finally:
        await nonstream.aclose()
        await stream.aclose()
    if args.stream_levels:
        levels = await stream_levels(args, paced, pids)
        result["streams"] = [level.to_json() for level in levels]
    return result


def run(args: argparse.Namespace) -> int:
    pinning = Pinning(0, 1) if args.pin else Pinning(args.pin_gateway, args.pin_others)
    pin_self(pinning.others_cpu)
    out = Path(args.out) if args.out else output_dir("overhead", "gateway")
    out.mkdir(parents=True, exist_ok=True)
    paced_engine = EngineOptions(
        STREAM_MODEL, first_token_delay_ms=0, token_delay_ms=args.stream_token_delay_ms
    )
    fast_engine = EngineOptions(FAST_MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with Fleet(1, paced_engine, gateway=None, pinning=pinning, log_dir=out / "logs-paced") as paced:
        extra = ({"model": STREAM_MODEL, "engine": "vllm", "replicas": {"static": paced.engine_urls}},)
        gateway = GatewayOptions(config_path=args.gateway_config, extra_pools=extra)
        with Fleet(1, fast_engine, gateway, pinning=pinning, log_dir=out / "logs") as fleet:
            assert fleet.gateway_url is not None and fleet.gateway_pid is not None
            fast = {"direct": fleet.engine_urls[0], "gateway": fleet.gateway_url}
            slow = {"direct": paced.engine_urls[0], "gateway": fleet.gateway_url}
            pids = {"gateway": fleet.gateway_pid, "engine": paced.engine_pids[0], "client": os.getpid()}
            result = asyncio.run(measure(args, fast, slow, pids))
    meta = {
        "argv": sys.argv[1:],
        "pinning": {"gateway_cpu": pinning.gateway_cpu, "others_cpu": pinning.others_cpu},
        "environment": environment(),
        "params": {k: v for k, v in vars(args).items() if k != "func"},
    }
    write_overhead(out, meta, result)
    print(render_overhead(meta, result))
    print(f"written: {out}/overhead.json, {out}/report.md", file=sys.stderr)
    return 0
