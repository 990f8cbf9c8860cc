"""`python -m bench.feature_cost`: what tracing and the access log cost the gateway per request, against
the gateway with both off and the reference proxy, in one run (bench/cpu_per_request.py: interleaved
closed-loop blocks, CPU time per request of each server process).

Servers, all in front of one zero-delay mock engine, each a process of its own:
- `reference`: the reference proxy (bench/reference_proxy.py);
- `gateway`: default settings (tracing off, access log off);
- `gateway+access-log`: `access_log: {enabled: true}` (every line kept, written to stdout: the
  process's log file);
- `gateway+tracing-none`: `tracing: {enabled: true, exporter: none}` (spans built and dropped);
- `gateway+tracing-otlp`: `tracing: {enabled: true}` exporting OTLP/HTTP to a sink in this process that
  answers 200 to every POST (the gateway's serialisation and export thread count; the sink's work does
  not).

`--servers` picks some of them; `--kinds` non-streamed and/or streamed requests (`--stream-tokens`
chunks). Prints one table per kind and writes the blocks to `--json` when given. Compare figures within
one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.cpu_per_request import (
    Target,
    chat_bodies,
    gateway_process,
    interleaved_blocks,
    reference_proxy,
    render,
    summarize,
    to_json,
)
from bench.fleet import Fleet
from bench.fleet_config import EngineOptions
from bench.listen_ports import free_port

MODEL = "bench-fast"


def variants(sink_port: int) -> dict[str, dict[str, Any]]:
    """Gateway server name → its settings overrides."""
    otlp = f"http://127.0.0.1:{sink_port}/v1/traces"
    return {
        "gateway": {},
        "gateway+access-log": {"access_log": {"enabled": True}},
        "gateway+tracing-none": {"tracing": {"enabled": True, "exporter": "none"}},
        "gateway+tracing-otlp": {"tracing": {"enabled": True, "endpoint": otlp}},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ["reference", *variants(0)]
    parser.add_argument("--servers", nargs="*", default=names, choices=names)
    parser.add_argument("--kinds", nargs="*", default=["non-streamed", "streamed"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000, help="per block")
    parser.add_argument("--warmup", type=int, default=500, help="per server, unmeasured")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=32)
    parser.add_argument("--json", default=None)


@contextlib.asynccontextmanager
async def otlp_sink(port: int, received: dict[str, int]) -> AsyncIterator[None]:
    """An HTTP server on `port` that answers every POST with 200 and an empty body, counting the POSTs
    and their bytes into `received`."""

    async def accept(request: web.Request) -> web.Response:
        received["posts"] += 1
        received["bytes"] += len(await request.read())
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/{tail:.*}", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def measure(targets: list[Target], args: argparse.Namespace, sink_port: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    received = {"posts": 0, "bytes": 0}
    async with otlp_sink(sink_port, received):
        for kind in args.kinds:
            stream = kind == "streamed"
            tokens = args.stream_tokens if stream else args.max_tokens
            bodies = chat_bodies(MODEL, max_tokens=tokens, stream=stream)
            out[kind] = await interleaved_blocks(
                targets,
                bodies,
                rounds=args.rounds,
                requests=args.requests,
                concurrency=args.concurrency,
                warmup=args.warmup,
            )
    print(f"OTLP sink: {received['posts']} exports, {received['bytes']} bytes", file=sys.stderr)
    return out


def run(args: argparse.Namespace) -> int:
    sink_port = free_port()
    engine = EngineOptions(MODEL, first_token_delay_ms=0, token_delay_ms=0)
    with tempfile.TemporaryDirectory(prefix="feature-cost-") as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        fleet = stack.enter_context(Fleet(1, engine, gateway=None, log_dir=logs))
        upstream = fleet.engine_urls[0]
        targets: list[Target] = []
        for name, overrides in variants(sink_port).items():
            if name in args.servers:
                targets.append(stack.enter_context(gateway_process(name, MODEL, upstream, logs, overrides)))
        if "reference" in args.servers:
            targets.append(stack.enter_context(reference_proxy(upstream, logs)))
        blocks = asyncio.run(measure(targets, args, sink_port))
    for kind, kind_blocks in blocks.items():
        print(
            f"\n{kind}, concurrency {args.concurrency}, {args.rounds} rounds of {args.requests} requests:\n"
        )
        print(render(summarize(kind_blocks)))
    if args.json:
        Path(args.json).write_text(json.dumps({k: to_json(v) for k, v in blocks.items()}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.feature_cost", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
