"""`python -m bench.workers_throughput`: the gateway with `server.workers: 1` and with `--workers` (default
2) side by side in one run: max req/s of a closed loop and CPU per request (bench/cpu_per_request.py's
client and interleaved blocks).

Both gateways run at once in front of one zero-delay mock engine, with default settings except
`state.backend: redis` (several workers need it; the one-worker gateway gets it too, so that only the
worker count differs; each on a key prefix of its own). A gateway's CPU is its whole process tree's
(supervisor and workers: /proc/<pid>/task/<pid>/children). Needs Redis at `--redis-url`.

On a host where the client, the engine and the gateway share the cores, a second worker cannot double
the rate: report the host's core count with the figures. Compare figures within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.cpu_per_request import Block, Target, chat_bodies, closed_loop, gateway_process, render, summarize
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions
from bench.proc import CpuReading

MODEL = "bench-fast"


def tree_cpu(pid: int) -> CpuReading:
    """CPU of `pid` and its live children, summed (stat ticks and schedstat)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    readings = [CpuReading.of(p) for p in (pid, *map(int, children))]
    return CpuReading(sum(r.ticks_s for r in readings), sum(r.sched_ns for r in readings))


async def blocks(
    targets: Sequence[Target],
    bodies: Sequence[bytes],
    *,
    rounds: int,
    requests: int,
    concurrency: int,
    warmup: int,
) -> list[Block]:
    """Warm-up blocks, then `rounds` rounds of one block per target (order rotated each round)."""
    out: list[Block] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        for target in targets:
            await closed_loop(session, target.url, bodies, requests=warmup, concurrency=concurrency)
        for r in range(rounds):
            shift = r % len(targets)
            for target in [*targets[shift:], *targets[:shift]]:
                before, started = tree_cpu(target.pid), time.perf_counter()
                await closed_loop(session, target.url, bodies, requests=requests, concurrency=concurrency)
                wall_s, after = time.perf_counter() - started, tree_cpu(target.pid)
                sched_s = (after.sched_ns - before.sched_ns) / 1e9
                out.append(Block(target.name, requests, after.ticks_s - before.ticks_s, sched_s, wall_s))
    return out


def run(args: argparse.Namespace) -> int:
    engine = EngineOptions(MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with tempfile.TemporaryDirectory(prefix="workers-throughput-") as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        fleet = stack.enter_context(Fleet(1, engine, gateway=None, log_dir=logs))
        targets = []
        for workers in (1, args.workers):
            state = {
                "backend": "redis",
                "url": args.redis_url,
                "key_prefix": f"bench-workers:{uuid.uuid4().hex}:",
            }
            overrides = {"server": {"workers": workers}, "state": state}
            name = f"{workers} worker{'s' if workers > 1 else ''}"
            targets.append(
                stack.enter_context(gateway_process(name, MODEL, fleet.engine_urls[0], logs, overrides))
            )
        time.sleep(args.settle_s)  # every worker up (/readyz answered by one of them)
        bodies = chat_bodies(MODEL, max_tokens=args.max_tokens, stream=False)
        measured = asyncio.run(
            blocks(
                targets,
                bodies,
                rounds=args.rounds,
                requests=args.requests,
                concurrency=args.concurrency,
                warmup=args.warmup,
            )
        )
    cores = len(os.sched_getaffinity(0))
    print(f"\nnon-streamed, C={args.concurrency}, {args.rounds} rounds of {args.requests}; {cores} cores")
    print(render(summarize(measured), reference="1 worker"))
    for block in measured:
        rate = block.requests / block.wall_s
        print(f"{block.target}: {rate:.0f} req/s, {block.us_per_request:.0f} µs/request")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workers_throughput", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6000, help="per block")
    parser.add_argument("--warmup", type=int, default=1000, help="per gateway, unmeasured")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
