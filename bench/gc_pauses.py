"""`python -m bench.gc_pauses`: the gateway's garbage-collection pauses under a short closed-loop load,
for each GC policy compared (docs/BENCHMARKS.md, "Per-request leftovers and GC pauses").

Processes: one zero-delay mock engine; the gateway, started by this module in its `--child` mode (the
runner's `serve`, with a `gc.callbacks` timer on every collection and the policy under test applied once
the app's start-up is done); this process as the client (aiohttp: `--concurrency` workers in a closed
loop of non-streamed chat requests, one in `--stream-every` streamed, for `--seconds`, and a `/healthz`
probe every `--probe-ms`, whose latency shows the stalls a client sees).

Policies (`--policies`, each started fresh, interleaved over `--runs` rounds):
- `default`: CPython's collector as the interpreter starts it (thresholds 700, 10, 10);
- `freeze`: `gc.collect()` then `gc.freeze()` after start-up: what start-up built (modules, settings,
  metrics, the app) leaves the collected generations, so a full collection walks only what came later;
- `gateway`: what the runner sets (`gateway.base.gc_tuning.tune_collector`: the freeze and a larger
  threshold for the youngest generation);
- `freeze-threshold` (not run unless named): `freeze`, and the youngest generation's threshold at
  `--threshold0`, to try other thresholds.
Run from a checkout that predates the runner's setting, with this file copied in, `gateway` applies
nothing and the others are applied once the app's start-up is done.

Reported per policy: medians over the runs, with the smallest and largest run: collections per
generation, the longest and the median full (generation-2) collection, the time spent collecting per
second of load, the /healthz probe's p99 and worst latency, the requests per second, and the peak RSS.
The figures depend on the machine and what else runs on it: compare policies within one run of this
command, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.fleet import Fleet
from bench.fleet_config import EngineOptions
from bench.listen_ports import free_port
from bench.report import environment
from bench.stats import percentile

MODEL = "bench-fast"
POLICIES = ("default", "freeze", "gateway")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies", nargs="*", default=list(POLICIES), choices=(*POLICIES, "freeze-threshold")
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds; each round runs every policy once")
    parser.add_argument("--seconds", type=float, default=10.0, help="load per run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream-every", type=int, default=4, help="one request in N is streamed")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--probe-ms", type=float, default=20.0, help="/healthz probe period")
    parser.add_argument("--threshold0", type=int, default=10_000, help="gen-0 threshold of freeze-threshold")
    parser.add_argument("--json", default=None, help="write every run's figures here")


# --- the gateway child: serve with every collection timed ----------------------------------------------


class CollectionTimer:
    """`gc.callbacks` entry: the duration of every collection, by generation, from `reset()` on."""

    def __init__(self) -> None:
        self._started = 0.0
        self.durations_s: dict[int, list[float]] = {0: [], 1: [], 2: []}

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.durations_s[info["generation"]].append(time.perf_counter() - self._started)

    def reset(self) -> None:
        self.durations_s = {0: [], 1: [], 2: []}


def apply_policy(policy: str, threshold0: int) -> None:
    """The policy under test (module docstring), applied once start-up is done."""
    if policy in ("freeze", "freeze-threshold"):
        gc.collect()
        gc.freeze()
    if policy == "freeze-threshold":
        gc.set_threshold(threshold0, *gc.get_threshold()[1:])


def run_child(config: str, report: str, policy: str, threshold0: int) -> int:
    """`serve` the config under `policy`; the collections from the end of start-up (the policy applied)
    to the exit go to `report`."""
    import gateway.uvicorn_runner as runner
    from gateway.app import GatewayApp
    from gateway.config.settings import load_settings

    timer = CollectionTimer()
    gc.callbacks.append(timer)
    started: dict[str, Any] = {}
    production = getattr(runner, "tune_collector", None)

    def after_startup() -> None:
        if policy == "gateway":
            if production is not None:
                production()
        else:
            apply_policy(policy, threshold0)
        started.update(tracked=len(gc.get_objects()), frozen=gc.get_freeze_count(), at=time.perf_counter())
        timer.reset()

    if production is not None:
        runner.tune_collector = after_startup  # type: ignore[attr-defined]
    else:  # a gateway from before the runner set the collector: after the app's start-up
        startup = GatewayApp.startup

        async def startup_then_policy(app: GatewayApp) -> None:
            await startup(app)
            after_startup()

        GatewayApp.startup = startup_then_policy  # type: ignore[method-assign,assignment]

    def write() -> None:
        wall_s = time.perf_counter() - started.get("at", time.perf_counter())
        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        figures = {"durations_s": timer.durations_s, "wall_s": wall_s, "rss_mib": rss_kib / 1024, **started}
        figures["threshold"] = list(gc.get_threshold())
        Path(report).write_text(json.dumps(figures))

    atexit.register(write)
    runner.serve(load_settings(config), log_level="warning")
    return 0


# --- the client -------------------------------------------------------------------------------------


async def _load(url: str, args: argparse.Namespace) -> dict[str, Any]:
    stop_at = time.monotonic() + args.seconds
    done = {"ok": 0, "failed": 0}
    probes: list[float] = []
    connector = aiohttp.TCPConnector(limit=args.concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(n: int) -> None:
            i = n
            while time.monotonic() < stop_at:
                stream = args.stream_every > 0 and i % args.stream_every == 0
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"ping {i % 97}"}],
                    "max_tokens": args.max_tokens,
                    "stream": stream,
                }
                async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                    await response.read()
                    done["ok" if response.status == 200 else "failed"] += 1
                i += args.concurrency

        async def probe() -> None:
            while time.monotonic() < stop_at:
                sent = time.perf_counter()
                async with session.get(f"{url}/healthz") as response:
                    await response.read()
                probes.append(time.perf_counter() - sent)
                await asyncio.sleep(args.probe_ms / 1e3)

        started = time.monotonic()
        await asyncio.gather(probe(), *(worker(n) for n in range(args.concurrency)))
        wall_s = time.monotonic() - started
    return {"rps": done["ok"] / wall_s, "failed": done["failed"], "probes_s": probes}


def _gateway_config(engine_url: str, port: int) -> dict[str, Any]:
    pool = {"model": MODEL, "engine": "vllm", "replicas": {"static": [engine_url]}}
    return {"server": {"host": "127.0.0.1", "port": port, "drain_timeout_s": 1}, "pools": [pool]}


def _one_run(policy: str, engine_url: str, workdir: Path, args: argparse.Namespace, n: int) -> dict[str, Any]:
    port = free_port()
    config = workdir / f"gateway-{policy}-{n}.yaml"
    config.write_text(json.dumps(_gateway_config(engine_url, port)))
    report = workdir / f"gc-{policy}-{n}.json"
    argv = [sys.executable, "-m", "bench.gc_pauses", "--child", str(config), "--report", str(report)]
    argv += ["--child-policy", policy, "--threshold0", str(args.threshold0)]
    log = (workdir / f"gateway-{policy}-{n}.log").open("wb")
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"the gateway did not start: {workdir}/gateway-{policy}-{n}.log")
        load = asyncio.run(_load(url, args))
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
        log.close()
    gc_figures = json.loads(report.read_text())
    return {"policy": policy, **load, **gc_figures}


def _summary(run: dict[str, Any]) -> dict[str, float]:
    """One run's figures (milliseconds, counts, per second of load)."""
    durations = {int(g): d for g, d in run["durations_s"].items()}
    full = durations[2]
    probes = run["probes_s"]
    return {
        "rps": run["rps"],
        "gen0": len(durations[0]),
        "gen1": len(durations[1]),
        "gen2": len(full),
        "gen2_max_ms": max(full, default=0.0) * 1e3,
        "gen2_p50_ms": statistics.median(full) * 1e3 if full else 0.0,
        "pause_max_ms": max((max(d, default=0.0) for d in durations.values()), default=0.0) * 1e3,
        "gc_ms_per_s": sum(sum(d) for d in durations.values()) * 1e3 / run["wall_s"],
        "probe_p99_ms": percentile(probes, 99) * 1e3 if probes else 0.0,
        "probe_max_ms": max(probes, default=0.0) * 1e3,
        "rss_mib": run["rss_mib"],
        "tracked_after_startup": run["tracked"],
        "frozen": run["frozen"],
    }


def _table(runs: list[dict[str, Any]], policies: list[str]) -> str:
    columns = list(_summary(runs[0]))
    lines = ["| policy | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for policy in policies:
        rows = [_summary(r) for r in runs if r["policy"] == policy]
        cells = []
        for column in columns:
            values = sorted(row[column] for row in rows)
            cells.append(f"{statistics.median(values):.4g} ({values[0]:.4g}–{values[-1]:.4g})")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    engine = EngineOptions(MODEL, first_token_delay_ms=0, token_delay_ms=0)
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="gc-pauses-") as tmp,
        Fleet(1, engine, None, log_dir=Path(tmp)) as fleet,
    ):
        for n in range(args.runs):
            order = args.policies if n % 2 == 0 else list(reversed(args.policies))
            for policy in order:
                runs.append(_one_run(policy, fleet.engine_urls[0], Path(tmp), args, n))
                print(f"run {n} {policy}: {json.dumps(_summary(runs[-1]))}", file=sys.stderr)
    print(f"medians (min–max) of {args.runs} runs, {args.seconds:g} s each at C={args.concurrency}")
    print(_table(runs, args.policies))
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": environment(), "runs": runs}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_pauses", description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-policy", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return run_child(args.child, args.report, args.child_policy, args.threshold0)
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
