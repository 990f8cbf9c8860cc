"""Gateway overhead: the same client sends the same request to the engine directly and through the
gateway, interleaved (direct, gateway, direct, …), so both see the same machine noise.

Processes: one mock engine (zero simulated delay) and one gateway, each a separate process, optionally
pinned (`--gateway-cpu 0 --others-cpu 1`: the gateway on one core, the client and the engine on the
other). Added latency = gateway percentile − direct percentile, over `--requests` pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import httpx

MODEL = "bench-model"


@dataclass(frozen=True)
class OverheadResult:
    requests: int
    direct_p50_ms: float
    direct_p99_ms: float
    gateway_p50_ms: float
    gateway_p99_ms: float

    @property
    def added_p50_ms(self) -> float:
        return self.gateway_p50_ms - self.direct_p50_ms

    @property
    def added_p99_ms(self) -> float:
        return self.gateway_p99_ms - self.direct_p99_ms


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _wait_ready(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


def start_processes(stack: ExitStack, engine_port: int, gateway_port: int, gateway_cpu: int | None,
                    others_cpu: int | None) -> None:
    engine = [*_pin(others_cpu), sys.executable, "-m", "mock_engine", "--port", str(engine_port), "--model", MODEL,
              "--first-token-delay-ms", "0", "--token-delay-ms", "0"]
    stack.callback(_stop, subprocess.Popen(engine))
    config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    stack.callback(os.unlink, config.name)
    config.write(json.dumps({
        "server": {"host": "127.0.0.1", "port": gateway_port, "drain_timeout_s": 1},
        "pools": [{"model": MODEL, "replicas": {"static": [f"http://127.0.0.1:{engine_port}"]}}],
    }))
    config.close()
    gateway = [*_pin(gateway_cpu), sys.executable, "-m", "gateway", "serve", "--config", config.name,
               "--log-level", "warning"]
    stack.callback(_stop, subprocess.Popen(gateway))
    _wait_ready(f"http://127.0.0.1:{engine_port}/health")
    _wait_ready(f"http://127.0.0.1:{gateway_port}/readyz")


def measure(engine_url: str, gateway_url: str, requests: int, warmup: int = 50) -> OverheadResult:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}
    direct: list[float] = []
    via: list[float] = []
    with httpx.Client(timeout=10) as client:
        for i in range(warmup + requests):
            for base, sink in ((engine_url, direct), (gateway_url, via)):
                started = time.perf_counter()
                response = client.post(base + "/v1/chat/completions", json=body)
                elapsed_ms = (time.perf_counter() - started) * 1000
                response.raise_for_status()
                if i >= warmup:
                    sink.append(elapsed_ms)
    return OverheadResult(requests, statistics.median(direct), percentile(direct, 99),
                          statistics.median(via), percentile(via, 99))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--engine-port", type=int, default=18101)
    parser.add_argument("--gateway-port", type=int, default=18080)
    parser.add_argument("--gateway-cpu", type=int, default=None)
    parser.add_argument("--others-cpu", type=int, default=None)
    args = parser.parse_args(argv)
    if args.others_cpu is not None:
        os.sched_setaffinity(0, {args.others_cpu})
    with ExitStack() as stack:
        start_processes(stack, args.engine_port, args.gateway_port, args.gateway_cpu, args.others_cpu)
        result = measure(f"http://127.0.0.1:{args.engine_port}", f"http://127.0.0.1:{args.gateway_port}", args.requests)
    summary = {**asdict(result), "added_p50_ms": result.added_p50_ms, "added_p99_ms": result.added_p99_ms}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
