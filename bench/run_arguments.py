"""The command-line arguments shared by `bench run` and `bench compare`: the local fleet, its faults, the
workload, the load, the client and SLO, and the output. What they build is `bench.options`."""

from __future__ import annotations

import argparse

from bench.arrivals import ARRIVAL_KINDS
from bench.disagg import PROTOCOLS
from bench.faults import DEFAULT_POISON_MARKER
from bench.presets import preset_help
from mock_engine.faults import POISON_EFFECTS

DEFAULT_MODEL = "bench-model"


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("local fleet (started and stopped by the benchmark)")
    g.add_argument("--replicas", type=int, default=2, help="mock-engine replicas (default 2)")
    g.add_argument("--model", default=DEFAULT_MODEL, help="model name served / sent")
    g.add_argument("--core", default=None, help="mock-engine core, e.g. physics (default: the engine's)")
    g.add_argument("--profile", default=None, help="engine profile for the physics core, e.g. h100-13b-fp16")
    g.add_argument("--speed", type=float, default=None, help="simulated seconds per wall second")
    g.add_argument("--first-token-delay-ms", type=float, default=None, help="fixed-delay core: prefill time")
    g.add_argument("--token-delay-ms", type=float, default=None, help="fixed-delay core: time per token")
    g.add_argument("--engine-arg", action="append", default=[], help="extra mock-engine argument (repeat)")
    g.add_argument("--gateway-config", default=None, help="gateway YAML template (replicas filled in)")
    g.add_argument(
        "--pool-set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        help="override a key of the pool, e.g. max_concurrency_per_replica=16 or continuation.enabled=false "
        "(dotted keys reach into a mapping; repeat)",
    )
    g.add_argument(
        "--gateway-set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        help="override a top-level key of the gateway config, e.g. state.backend=redis (dotted; repeat)",
    )
    g.add_argument(
        "--gateway-instances",
        type=int,
        default=1,
        metavar="N",
        help="gateway processes with the same config over the same engines, sharing nothing (default 1); "
        "requests go to them in turn, one each, as an L4 load balancer spreads them",
    )
    g.add_argument(
        "--base-port", type=int, default=None, help="gateway port (N instances: P…P+N-1); engines on the next"
    )
    g.add_argument(
        "--disagg",
        action="append",
        default=[],
        metavar="[LABEL=]P:D[@LINK]",
        help="a disaggregated fleet: P prefill + D decode engines, the pool with `disaggregation:` "
        "(run: one; compare: each is an entry beside the aggregated ones, e.g. 2:2 or 1:3@tcp)",
    )
    g.add_argument("--disagg-protocol", choices=PROTOCOLS, default="vllm", help="prefill/decode protocol")
    g.add_argument(
        "--kv-link",
        default=None,
        help="the disaggregated engines' KV link: nvlink, rdma, tcp or GB/s (default: the engine's, rdma)",
    )
    g.add_argument("--pin-gateway", type=int, default=None, metavar="CPU", help="taskset the gateway")
    g.add_argument(
        "--pin-others", type=int, default=None, metavar="CPU", help="taskset the engines and the client"
    )

    g = parser.add_argument_group("faults (bench/faults.py)")
    g.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="EVENT",
        help="a scheduled fault, wall clock from the first measured send: 'at=20s kill=0', "
        "'at=40s restart=0', 'at=5s replica=1 set=crash_after_tokens:20,crash_rate:0.3', 'at=30s clear=1' "
        "(repeat; local fleet)",
    )
    g.add_argument(
        "--poison-fraction", type=float, default=0.0, help="share of requests carrying the poison marker"
    )
    g.add_argument("--poison-effect", choices=POISON_EFFECTS, default="stall", help="what engines do to them")
    g.add_argument(
        "--poison-marker", default=DEFAULT_POISON_MARKER, help="text appended to a poisoned prompt"
    )


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument("--workload", default="shared-prefix-small", help=f"one of: {preset_help()}")
    g.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="workload field")
    g.add_argument("--trace", default=None, help="JSONL trace file replacing the workload")
    g.add_argument("--priority-mix", default="", help="e.g. critical=0.1,interactive=0.6,batch=0.3")
    g.add_argument("--api", choices=("chat", "completions"), default="chat")
    g.add_argument("--dump-workload", default=None, metavar="PATH", help="write the requests as a trace")

    g = parser.add_argument_group("load")
    g.add_argument("--arrival", choices=ARRIVAL_KINDS, default="poisson")
    g.add_argument("--rate", type=float, nargs="+", default=[4.0], help="req/s (several: a sweep)")
    g.add_argument("--concurrency", type=int, nargs="+", default=[8], help="closed loop users (sweep)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (<1 burstier)")
    g.add_argument("--spike-factor", type=float, default=3.0)
    g.add_argument("--spike-start-s", type=float, default=10.0)
    g.add_argument("--spike-duration-s", type=float, default=10.0)
    g.add_argument("--requests", type=int, default=None, help="requests per run (default 200)")
    g.add_argument("--duration-s", type=float, default=None, help="run length instead of a count")
    g.add_argument("--warmup-requests", type=int, default=0)
    g.add_argument("--warmup-s", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="report in simulated time: wall × this (default: --speed for a local fleet, else 1)",
    )

    g = parser.add_argument_group("client and SLO")
    g.add_argument("--no-stream", action="store_true", help="non-streamed requests (TTFT = e2e)")
    g.add_argument(
        "--client",
        choices=("httpx", "raw"),
        default="httpx",
        help="httpx (default) or raw: a bare-asyncio streaming client, far cheaper per stream (streams only)",
    )
    g.add_argument(
        "--keep-alive",
        action="store_true",
        help="raw client: reuse connections (HTTP/1.1 keep-alive) like SDK clients; default: one per request",
    )
    g.add_argument("--timeout-s", type=float, default=300.0)
    g.add_argument("--api-key", default=None)
    g.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    g.add_argument("--honour-retry-after", type=int, default=0, metavar="N", help="retry up to N times")
    g.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    g.add_argument("--slo-tpot-ms", type=float, default=50.0)
    g.add_argument(
        "--class-slo",
        action="append",
        default=[],
        metavar="CLASS=TTFT_MS[:TPOT_MS]",
        help="judge a --priority-mix class by objectives of its own (e.g. batch=60000); TPOT as "
        "--slo-tpot-ms unless given",
    )
    g.add_argument("--sample-interval-s", type=float, default=0.5, help="engine /metrics polling")

    g = parser.add_argument_group("output")
    g.add_argument("--out", default=None, help="output directory (default bench/results/<time>-…)")
    g.add_argument("--name", default=None, help="name in the output directory and title")
    g.add_argument("--no-plots", action="store_true")
    g.add_argument("--quiet", action="store_true", help="no progress line")
