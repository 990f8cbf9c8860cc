"""`python -m bench.workers_throughput`: gateways that differ only in `server.workers` and `state.backend`
side by side in one run: max req/s of a closed loop and CPU per request (bench/cpu_per_request.py's
client and interleaved blocks).

`--gateways` lists them as WORKERS:STATE (default `1:memory,2:memory,1:redis,2:redis`): every one runs at
once in front of one zero-delay mock engine, with default settings but those two (a Redis one on a key
prefix of its own). Several workers on memory state share the supervisor's local state server
(`gateway.ops.local_state`); one worker on memory state keeps its state in its own memory. A gateway's
CPU is its whole process tree's (supervisor, workers and the local state server:
/proc/<pid>/task/<pid>/children); a Redis at `--redis-url` is outside it: give `--redis-pid` to count
its CPU during a Redis gateway's blocks with that gateway's (the other gateways' background calls to it
included: small next to a block's load). `--state-per-request` puts shared state on every request's
path (a tenant limit, bulkhead and replica cap that never bind).

On a host where the client, the engine and the gateway share the cores, a second worker cannot double
the rate: report the host's core count with the figures. Compare figures within one run only.
`--per-worker-rate R` drives each gateway in an open loop at R × its workers req/s instead (every
worker then carries the same load: `bench.open_loop` says why that is the comparison that projects
to N saturated workers on N free cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from admission.tenants import hash_api_key
from bench.cpu_per_request import (
    chat_bodies,
    gateway_process,
    interleaved_blocks,
    render,
    summarize,
)
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions
from bench.process_roles import RoleLedger

MODEL = "bench-fast"
BENCH_KEY = "sk-bench-workers"
NEVER_BINDING = 1_000_000
STATEFUL_TENANT = {
    "name": "bench",
    "api_key_hashes": [hash_api_key(BENCH_KEY)],
    "requests_per_min": float(NEVER_BINDING) * 60,
    "max_concurrent": NEVER_BINDING,
}
"""`--state-per-request`: a tenant whose rate limit and bulkhead never bind but are checked on every
request (a rate-limit script, a lease acquired and released), and a replica cap that never binds (slot
credits)."""


def run(args: argparse.Namespace) -> int:
    engine = EngineOptions(MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with tempfile.TemporaryDirectory(prefix="workers-throughput-") as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        fleet = stack.enter_context(Fleet(1, engine, gateway=None, log_dir=logs))
        targets = []
        rates: dict[str, float] = {}
        for workers, backend in args.gateways:
            state: dict[str, str] = {"backend": backend}
            if backend == "redis":
                state |= {"url": args.redis_url, "key_prefix": f"bench-workers:{uuid.uuid4().hex}:"}
            overrides: dict[str, Any] = {"server": {"workers": workers}, "state": state}
            pool: dict[str, Any] = {}
            if args.state_per_request:
                overrides["tenants"] = [STATEFUL_TENANT]
                pool["max_concurrency_per_replica"] = NEVER_BINDING
            name = f"{workers} worker{'s' if workers > 1 else ''} {backend}"
            upstream = fleet.engine_urls[0]
            if args.per_worker_rate:
                rates[name] = args.per_worker_rate * workers
            targets.append(
                stack.enter_context(
                    gateway_process(name, MODEL, upstream, logs, overrides, pool_overrides=pool)
                )
            )
        time.sleep(args.settle_s)  # every worker up (/readyz answered by one of them)
        bodies = chat_bodies(MODEL, max_tokens=args.max_tokens, stream=False)
        redis_pid = {t.name: args.redis_pid for t in targets if t.name.endswith("redis") and args.redis_pid}
        ledger = RoleLedger(redis_pid)
        measured = asyncio.run(
            interleaved_blocks(
                targets,
                bodies,
                rounds=args.rounds,
                requests=args.requests,
                concurrency=args.concurrency,
                warmup=args.warmup,
                headers={"authorization": f"Bearer {BENCH_KEY}"} if args.state_per_request else {},
                cpu_of=ledger.read,
                rate_of=(lambda target: rates[target.name]) if rates else None,
            )
        )
    cores = len(os.sched_getaffinity(0))
    stateful = "; a tenant limit, bulkhead and replica cap on every request" if args.state_per_request else ""
    load = f"open loop at {args.per_worker_rate:g} req/s per worker" if rates else f"C={args.concurrency}"
    shape = f"non-streamed, {load}, {args.rounds} rounds of {args.requests}"
    print(f"\n{shape}; {cores} cores{stateful}")
    summary = summarize(measured)
    print(render(summary, reference=targets[0].name))
    print("CPU µs/request by process (schedstat):")
    print(ledger.render({name: int(s["requests"]) for name, s in summary.items()}))
    for block in measured:
        rate = block.requests / block.wall_s
        print(f"{block.target}: {rate:.0f} req/s, {block.us_per_request:.0f} µs/request")
    return 0


def gateway_list(text: str) -> list[tuple[int, str]]:
    """`1:memory,2:redis` -> [(1, "memory"), (2, "redis")]; ValueError on anything else."""
    out = []
    for item in text.split(","):
        workers, _, backend = item.partition(":")
        if backend not in ("memory", "redis") or int(workers) < 1:
            raise ValueError(f"not WORKERS:memory|redis: {item!r}")
        out.append((int(workers), backend))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workers_throughput", description=__doc__)
    parser.add_argument(
        "--gateways",
        type=gateway_list,
        default=gateway_list("1:memory,2:memory,1:redis,2:redis"),
        help="WORKERS:STATE,... (STATE memory or redis); the first is the reference",
    )
    parser.add_argument(
        "--state-per-request",
        action="store_true",
        help="a tenant limit, bulkhead and replica cap (never binding) on every request",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6000, help="per block")
    parser.add_argument("--warmup", type=int, default=1000, help="per gateway, unmeasured")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--per-worker-rate",
        type=float,
        help="req/s per worker: an open loop at this × workers per gateway instead of the closed loop",
    )
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--redis-pid", type=int, help="that Redis's process id: its CPU counts with each Redis gateway's"
    )
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
