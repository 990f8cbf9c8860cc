"""`python -m bench.state_call_cost`: what one shared-state call costs on the local state server of
several workers (`gateway.ops.local_state`: `valkey-server` on a Unix socket) and, with `--redis-url`
and `--redis-pid`, on a Redis of your own: the rate-limit script (`admission.redis_rate_limit`, one
EVALSHA that reads the server's TIME and updates a hash) called `--calls` times, `--concurrency` at a
time from one client process over its pool of connections.

Per call: wall time (a closed loop's latency at concurrency 1, its inverse rate above), the client's
CPU (this process: redis-py and the store around the script) and the server's CPU (/proc: the
server's stat ticks). Linux only (/proc). Compare figures within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from admission.rate_limit import TenantRateLimits, TokenBucketLimit
from admission.redis_rate_limit import RedisRateLimitStore
from bench.proc import cpu_seconds
from core.shared_state import RedisBackend
from gateway.ops.local_state import LocalStateServer, server_binary

NEVER_EMPTY = TenantRateLimits(requests=TokenBucketLimit(capacity=1e12, refill_per_s=1e9))


async def measure(name: str, url: str, server_pid: int, calls: int, concurrency: int) -> str:
    """One line: µs per call (wall, client CPU, server CPU) and calls/s."""
    backend = RedisBackend.from_url(url, timeout_s=5.0)
    store = RedisRateLimitStore(backend)
    try:
        for i in range(concurrency):  # the script loaded, a connection per concurrent caller
            await store.acquire(f"tenant-{i}", NEVER_EMPTY, 1)

        async def caller(i: int) -> None:
            for _ in range(calls // concurrency):
                result = await store.acquire(f"tenant-{i % 4}", NEVER_EMPTY, 1)
                if result.degraded:
                    raise RuntimeError(f"{url}: a call failed (see the log)")

        server_s, client_s, started = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller(i) for i in range(concurrency)))
        wall_s = time.perf_counter() - started
        server_s, client_s = cpu_seconds(server_pid) - server_s, time.process_time() - client_s
    finally:
        await backend.aclose()
    done = calls // concurrency * concurrency
    return (
        f"| {name} | {concurrency} | {wall_s / done * 1e6:.0f} | {done / wall_s:,.0f} "
        f"| {client_s / done * 1e6:.0f} | {server_s / done * 1e6:.0f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state_call_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--redis-url", help="also measure this Redis (needs --redis-pid)")
    parser.add_argument("--redis-pid", type=int, help="its server's process id (for its CPU)")
    args = parser.parse_args(argv)
    server = LocalStateServer(server_binary())
    server.start()
    try:
        servers = [("local state server (Unix socket)", server.url, server.pid or 0)]
        if args.redis_url and args.redis_pid:
            servers.append((f"Redis at {args.redis_url}", args.redis_url, args.redis_pid))
        print("| server | concurrency | µs/call (wall) | calls/s | client CPU µs/call | server CPU µs/call |")
        print("|---|---|---|---|---|---|")
        for concurrency in args.concurrency:
            for name, url, pid in servers:
                print(asyncio.run(measure(name, url, pid, args.calls, concurrency)))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
