"""`bench overhead`: what the gateway adds. The same client sends the same request to the same engine,
directly, through the gateway, through the reference proxy (bench/reference_proxy.py: aiohttp server
and client on uvloop, the body passed through, nothing else) and through the floor proxy
(bench/reference_asgi_proxy.py: the same proxy on the gateway's stack, uvicorn + httptools + uvloop, a
plain ASGI callable, the aiohttp client), interleaved, so every path sees the same machine noise, and
every CPU figure of the gateway has both proxies' beside it from the same run (`--no-reference`: direct
and gateway only). Gateway ÷ floor is the cost of the gateway's own logic; floor ÷ reference, the
stack's.

Processes: a zero-delay mock engine (latency and throughput), a paced one (`--stream-token-delay-ms`,
for long-lived streams), the gateway with one pool for each and the two proxies in front of the
zero-delay engine. With `--pin` (or `--pin-gateway CPU --pin-others CPU`) the gateway and the
proxies run on one core and the client and engines on the other.

Phases (1 and 2 measured by bench/overhead_phases.py):
1. latency at concurrency 1, non-streamed then streamed (`--stream-tokens` chunks): `--requests`
   rounds, each round one request per path in rotating order; added = path percentile − direct
   percentile. Each server's CPU time (/proc/<pid>/stat utime + stime, and schedstat) over the phase ÷
   its requests.
2. max req/s: closed loop at `--throughput-concurrency` (sent by `--throughput-client`: `lean`, an
   aiohttp client cheap enough to saturate the servers, by default), one unmeasured block per path, then
   `--throughput-blocks` rounds of one block of `--throughput-block-s` per path (order rotating),
   non-streamed; req/s ratio path ÷ direct, each server's CPU per request and the added latency under
   load. The same for streams (`--stream-throughput-blocks`): CPU per stream under load.
3. with `--profile-gateway FILE`: one more closed-loop block of `--profile-s` through the gateway,
   non-streamed then streamed, each sampled by py-spy (bench/serve_profile.py): the share of the
   gateway's samples per serve-path stage (bench/profile_stages.py) is written to FILE (markdown) and
   the report, the collapsed stacks beside FILE. The measured phases are not sampled.
4. concurrent streams: at each of `--stream-levels`, N streams at once, direct then gateway, sent by
   `--stream-client` (`raw`, a bare-asyncio SSE client, by default: with hundreds of streams on one
   core httpx's pool bookkeeping, not the gateway, would set the limit); the
   largest N sustained without stalls (no failure, no gap over `--stall-ms`) and frames/s, with the CPU
   use (share of one core) of the gateway, the paced engine and the client during each level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.client import BenchClient, Client, ClientOptions
from bench.cpu_per_request import floor_proxy, reference_proxy
from bench.fleet import Fleet, Pinning, pin_self
from bench.fleet_config import EngineOptions, GatewayOptions
from bench.lean_client import LeanClient
from bench.overhead_phases import latency_pairs, throughput_blocks
from bench.overhead_report import render_overhead, write_overhead
from bench.proc import CpuReading
from bench.report import environment, output_dir
from bench.serve_profile import profile_blocks
from bench.streams import StreamLevel, httpx_sender, raw_sender, stream_level
from bench.workload import RequestSpec

FAST_MODEL = "bench-fast"
STREAM_MODEL = "bench-stream"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=200, help="measured pairs per latency phase")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured pairs first")
    parser.add_argument("--max-tokens", type=int, default=8, help="non-streamed output tokens")
    parser.add_argument("--stream-tokens", type=int, default=32, help="tokens per stream (~33 chunks)")
    parser.add_argument("--throughput-concurrency", type=int, default=64)
    parser.add_argument("--throughput-block-s", type=float, default=2.0)
    parser.add_argument("--throughput-blocks", type=int, default=3, help="blocks per path")
    parser.add_argument(
        "--stream-throughput-blocks", type=int, default=3, help="streamed blocks per path (0: none)"
    )
    parser.add_argument(
        "--throughput-client",
        choices=("lean", "httpx"),
        default="lean",
        help="client of the closed-loop blocks (lean: aiohttp, cheap enough to saturate; default lean)",
    )
    parser.add_argument("--no-reference", action="store_true", help="no reference or floor proxy path")
    parser.add_argument(
        "--profile-gateway",
        default=None,
        metavar="FILE",
        help="sample the gateway with py-spy under load; the per-stage breakdown to FILE",
    )
    parser.add_argument("--profile-s", type=float, default=10.0, help="profiled block length")
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
    args: argparse.Namespace,
    fast: dict[str, str],
    paced: dict[str, str],
    pids: dict[str, int],
    servers: dict[str, int],
) -> dict[str, Any]:
    """The phases; `fast`: path → URL over the zero-delay engine; `servers`: server name → pid (the
    gateway, and the reference and floor proxies unless `--no-reference`)."""
    nonstream = BenchClient(ClientOptions(model=FAST_MODEL, stream=False, timeout_s=30.0))
    stream = BenchClient(ClientOptions(model=FAST_MODEL, stream=True, timeout_s=30.0))
    loaded: dict[bool, Client] = {False: nonstream, True: stream}
    if args.throughput_client == "lean":
        loaded = {s: LeanClient(ClientOptions(model=FAST_MODEL, stream=s, timeout_s=30.0)) for s in loaded}
    ping = RequestSpec(messages=(("user", "ping"),), max_tokens=args.max_tokens)
    chunks = RequestSpec(messages=(("user", "ping"),), max_tokens=args.stream_tokens)
    result: dict[str, Any] = {}
    try:

        def say(message: str) -> None:
            if not args.quiet:
                print(message, file=sys.stderr)

        say("overhead: latency, non-streamed …")
        result["latency"] = await latency_pairs(
            nonstream, fast, ping, requests=args.requests, warmup=args.warmup, pids=servers
        )
        say("overhead: latency, streamed …")
        result["stream_latency"] = await latency_pairs(
            stream, fast, chunks, requests=args.requests, warmup=args.warmup, pids=servers
        )
        say("overhead: max req/s …")
        if args.throughput_blocks > 0:
            result["throughput"] = await throughput_blocks(loaded[False], fast, ping, args, pids=servers)
        if args.stream_throughput_blocks > 0:
            say("overhead: streams under load …")
            result["stream_throughput"] = await throughput_blocks(
                loaded[True], fast, chunks, args, pids=servers, blocks=args.stream_throughput_blocks
            )
        if args.profile_gateway:
            say("overhead: profiling the gateway …")
            kinds = {"non-streamed": (loaded[False], ping), "streamed": (loaded[True], chunks)}
            result["profile"] = await profile_blocks(
                Path(args.profile_gateway), servers["gateway"], fast["gateway"], kinds, args
            )
    finally:
        for client in {nonstream, stream, *loaded.values()}:
            await client.aclose()
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
    with contextlib.ExitStack() as stack:
        paced = stack.enter_context(
            Fleet(1, paced_engine, gateway=None, pinning=pinning, log_dir=out / "logs-paced")
        )
        # The paced engine's token delay is fixed, whatever its batch, and at the default TPOT objective:
        # a learned cap would cut it until its futile-cut check undid the cuts (gateway/upstream/
        # cut_check.py), refusing streams meanwhile. This phase measures the relay, not admission.
        paced_pool = {"model": STREAM_MODEL, "engine": "vllm", "replicas": {"static": paced.engine_urls}}
        extra = ({**paced_pool, "latency_model": {"adaptive_cap": False}},)
        gateway = GatewayOptions(config_path=args.gateway_config, extra_pools=extra)
        fleet = stack.enter_context(Fleet(1, fast_engine, gateway, pinning=pinning, log_dir=out / "logs"))
        assert fleet.gateway_url is not None and fleet.gateway_pid is not None
        fast = {"direct": fleet.engine_urls[0], "gateway": fleet.gateway_url}
        servers = {"gateway": fleet.gateway_pid}
        if not args.no_reference:
            for start in (reference_proxy, floor_proxy):
                ref = stack.enter_context(start(fleet.engine_urls[0], out / "logs", cpu=pinning.gateway_cpu))
                fast[ref.name], servers[ref.name] = ref.url, ref.pid
        slow = {"direct": paced.engine_urls[0], "gateway": fleet.gateway_url}
        pids = {"gateway": fleet.gateway_pid, "engine": paced.engine_pids[0], "client": os.getpid()}
        result = asyncio.run(measure(args, fast, slow, pids, servers))
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
