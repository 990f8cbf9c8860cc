"""CPU time per request of several servers side by side: the same closed-loop client drives each in turn,
in interleaved blocks, and each server process's CPU time (/proc/<pid>/stat utime + stime, and
schedstat) is read around its blocks (bench/proc.py). Used by the CI guard
(tests/integration/test_overhead_guard.py) and by `python -m bench.cpu_per_request`, which compares the
gateway with tracing or the access log on against the gateway with both off and the reference proxy.

- A block sends `requests` chat requests to one server, `concurrency` at a time (closed loop: a worker
  sends its next request when the previous answer ended), every one streamed or none; any answer that is
  not a 200 (or a stream without its `[DONE]`) fails the run (`BlockFailed`).
- Rounds: every server gets one unmeasured warm-up block of `warmup` requests first; then each round
  runs one block per server, the order rotated by one each round, so no server always goes first.
- Per server: the CPU µs per request of each block, their median and spread, and the total CPU over the
  total requests of its blocks (the steadier figure: /proc's ticks are 10 ms). Ratios are of totals.

The client is aiohttp on this process's loop, cheap enough that the servers, not the client, are what
is measured; the figures are CPU time, not wall time, so another load on the machine slows a block
without changing its CPU per request much (it changes batching a little: compare servers within one
run, never across runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.fleet_config import GatewayOptions, gateway_config
from bench.listen_ports import free_port
from bench.open_loop import open_loop
from bench.proc import CpuReading

DONE = b"data: [DONE]"


class BlockFailed(RuntimeError):
    """A request of a measured block was not answered 200 (or its stream did not end)."""


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    pid: int


@dataclass(frozen=True, slots=True)
class Block:
    target: str
    requests: int
    cpu_s: float
    """utime + stime over the block (/proc/<pid>/stat, clock ticks)."""
    sched_s: float
    """Run time of the live threads over the block (schedstat, ns clock)."""
    wall_s: float

    @property
    def us_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e6


def chat_bodies(model: str, *, max_tokens: int, stream: bool, variety: int = 97) -> list[bytes]:
    """`variety` distinct small chat bodies (the prompts differ, the shape does not)."""
    return [
        json.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": f"ping {i}"}],
                "max_tokens": max_tokens,
                "stream": stream,
            }
        ).encode()
        for i in range(variety)
    ]


async def closed_loop(
    session: aiohttp.ClientSession, url: str, bodies: Sequence[bytes], *, requests: int, concurrency: int
) -> None:
    """Send `requests` POSTs to `url`/v1/chat/completions, `concurrency` at a time; raise on a failure."""
    counter = iter(range(requests))
    headers = {"content-type": "application/json"}

    async def worker() -> None:
        for i in counter:
            async with session.post(
                f"{url}/v1/chat/completions", data=bodies[i % len(bodies)], headers=headers
            ) as answer:
                body = await answer.read()
                streamed = answer.headers.get("content-type", "").startswith("text/event-stream")
                if answer.status != 200 or (streamed and DONE not in body[-64:]):
                    raise BlockFailed(f"{url}: status {answer.status}: {body[:200]!r}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def interleaved_blocks(
    targets: Sequence[Target],
    bodies: Sequence[bytes],
    *,
    rounds: int,
    requests: int,
    concurrency: int,
    warmup: int,
    headers: dict[str, str] | None = None,
    cpu_of: Callable[[Target], CpuReading] | None = None,
    rate_of: Callable[[Target], float] | None = None,
) -> list[Block]:
    """Warm-up blocks, then `rounds` rounds of one block per target (order rotated each round), every
    request with `headers`; a block's CPU is `cpu_of(target)`'s difference (default: the target's
    process alone). With `rate_of`, a measured block is an open loop at `rate_of(target)` req/s
    (`bench.open_loop`) instead of the closed loop."""
    read = cpu_of or (lambda target: CpuReading.of(target.pid))
    blocks: list[Block] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        for target in targets:
            await closed_loop(session, target.url, bodies, requests=warmup, concurrency=concurrency)
        for r in range(rounds):
            shift = r % len(targets)
            for target in [*targets[shift:], *targets[:shift]]:
                before, started = read(target), time.perf_counter()
                if rate_of is None:
                    await closed_loop(session, target.url, bodies, requests=requests, concurrency=concurrency)
                else:
                    await open_loop(
                        session, target.url, bodies, requests=requests, rate_per_s=rate_of(target)
                    )
                wall_s, after = time.perf_counter() - started, read(target)
                sched_s = (after.sched_ns - before.sched_ns) / 1e9
                blocks.append(Block(target.name, requests, after.ticks_s - before.ticks_s, sched_s, wall_s))
    return blocks


def summarize(blocks: Sequence[Block]) -> dict[str, dict[str, float]]:
    """Per target: CPU µs per request (total ÷ requests; the blocks' median, min and max; schedstat's
    total), requests and req/s."""
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(b.target for b in blocks):
        mine = [b for b in blocks if b.target == name]
        per = [b.us_per_request for b in mine]
        n = sum(b.requests for b in mine)
        out[name] = {
            "us_per_request": sum(b.cpu_s for b in mine) / n * 1e6,
            "median_us": statistics.median(per),
            "min_us": min(per),
            "max_us": max(per),
            "sched_us_per_request": sum(b.sched_s for b in mine) / n * 1e6,
            "requests": n,
            "rps": n / sum(b.wall_s for b in mine),
        }
    return out


def ratio(summary: dict[str, dict[str, float]], name: str, reference: str) -> float:
    return summary[name]["us_per_request"] / summary[reference]["us_per_request"]


@contextlib.contextmanager
def child_server(
    name: str, argv: list[str], url: str, ready_path: str, log_path: Path, *, cpu: int | None = None
) -> Iterator[Target]:
    """A server child process (this interpreter, `argv`), ready when `url + ready_path` answers 200;
    SIGTERM on exit (SIGKILL after 5 s)."""
    prefix = ["taskset", "-c", str(cpu)] if cpu is not None else []
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*prefix, sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + ready_path, timeout=0.5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start within 30 s: see {log_path}")
            time.sleep(0.05)
        yield Target(name, url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reference_proxy(
    upstream: str, log_dir: Path, cpu: int | None = None, name: str = "reference"
) -> contextlib.AbstractContextManager[Target]:
    """The reference proxy (bench/reference_proxy.py) in front of `upstream`; ready when its `/health`
    (the upstream's, passed through) answers."""
    return _proxy("bench.reference_proxy", upstream, log_dir, cpu, name)


def floor_proxy(
    upstream: str, log_dir: Path, cpu: int | None = None, name: str = "floor"
) -> contextlib.AbstractContextManager[Target]:
    """The same bare proxy on the gateway's own stack (bench/reference_asgi_proxy.py: uvicorn, httptools,
    uvloop, a plain ASGI callable, the aiohttp client) in front of `upstream`; ready as the reference."""
    return _proxy("bench.reference_asgi_proxy", upstream, log_dir, cpu, name)


def _proxy(
    module: str, upstream: str, log_dir: Path, cpu: int | None, name: str
) -> contextlib.AbstractContextManager[Target]:
    port = free_port()
    argv = ["-m", module, "--port", str(port), "--upstream", upstream]
    return child_server(name, argv, f"http://127.0.0.1:{port}", "/health", log_dir / f"{name}.log", cpu=cpu)


def gateway_process(
    name: str,
    model: str,
    upstream: str,
    log_dir: Path,
    overrides: dict[str, Any] | None = None,
    *,
    pool_overrides: dict[str, Any] | None = None,
) -> contextlib.AbstractContextManager[Target]:
    """`llm-gateway serve` with the generated config (bench/fleet_config.py: one pool of `model` on
    `upstream`, default settings, `overrides` merged into the top level and `pool_overrides` into the
    pool), ready at `/readyz`."""
    port = free_port()
    options = GatewayOptions(settings_overrides=overrides or {}, pool_overrides=pool_overrides or {})
    config = gateway_config(options, model, [upstream], port)
    path = log_dir / f"{name}.yaml"
    path.write_text(json.dumps(config))
    argv = ["-m", "cli", "serve", "--config", str(path), "--log-level", "warning"]
    return child_server(name, argv, f"http://127.0.0.1:{port}", "/readyz", log_dir / f"{name}.log")


def render(summary: dict[str, dict[str, float]], reference: str = "reference") -> str:
    lines = [
        "| server | CPU µs/request (total) | blocks: median [min, max] | schedstat µs | req/s "
        "| ÷ reference |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        rel = f"{ratio(summary, name, reference):.2f}" if reference in summary else "–"
        lines.append(
            f"| {name} | {s['us_per_request']:.0f} | {s['median_us']:.0f} [{s['min_us']:.0f}, "
            f"{s['max_us']:.0f}] | {s['sched_us_per_request']:.0f} | {s['rps']:.0f} | {rel} |"
        )
    return "\n".join(lines) + "\n"


def to_json(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    return [
        {
            "target": b.target,
            "requests": b.requests,
            "cpu_s": b.cpu_s,
            "sched_s": b.sched_s,
            "wall_s": b.wall_s,
        }
        for b in blocks
    ]
