"""Command-line options shared by `bench run` and `bench compare`, and what they build: the fleet
options, the experiment (workload, load, client, SLO) and the load levels."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from bench.arrivals import ARRIVAL_KINDS
from bench.client import ClientOptions
from bench.disagg import PROTOCOLS, DisaggSpec, check_link, parse_disagg
from bench.execute import Experiment, LoadSpec
from bench.faults import DEFAULT_POISON_MARKER, Poison, parse_schedule
from bench.fleet import Pinning
from bench.fleet_config import EngineOptions, GatewayOptions, merge_into
from bench.presets import PRESETS, TraceWorkload, build_workload, preset_help
from bench.stats import Slo
from bench.workload import Workload, parse_priority_mix
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
    g.add_argument("--sample-interval-s", type=float, default=0.5, help="engine /metrics polling")

    g = parser.add_argument_group("output")
    g.add_argument("--out", default=None, help="output directory (default bench/results/<time>-…)")
    g.add_argument("--name", default=None, help="name in the output directory and title")
    g.add_argument("--no-plots", action="store_true")
    g.add_argument("--quiet", action="store_true", help="no progress line")


def poison(args: argparse.Namespace) -> Poison | None:
    if args.poison_fraction <= 0:
        return None
    return Poison(args.poison_fraction, args.poison_marker, args.poison_effect)


def engine_options(args: argparse.Namespace) -> EngineOptions:
    chosen = poison(args)
    return EngineOptions(
        model=args.model,
        core=args.core,
        profile=args.profile,
        speed=args.speed,
        first_token_delay_ms=args.first_token_delay_ms,
        token_delay_ms=args.token_delay_ms,
        seed=args.seed,
        extra_args=tuple(args.engine_arg) + (chosen.engine_args() if chosen is not None else ()),
    )


def pool_overrides(items: list[str], flag: str = "--pool-set") -> dict[str, Any]:
    """`KEY=YAML` items → nested overrides; a dotted key (`continuation.enabled=false`) reaches into a
    mapping of the pool, so `{"continuation": {"enabled": False}}` (merged, not replacing the mapping)."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not sep or not all(path):
            raise ValueError(f"{flag} {item!r} is not KEY=YAML")
        node = overrides
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"{flag} {item!r}: {part} is set to a value and used as a mapping")
            node = child
        merge_into(node, {path[-1]: yaml.safe_load(value)})
    return overrides


def gateway_options(
    args: argparse.Namespace,
    policy: str | None = None,
    config: str | None = None,
    variant: list[str] | None = None,
    disagg: DisaggSpec | None = None,
) -> GatewayOptions:
    """The gateway of one entry: the report's SLO in wall time, `--pool-set` overrides, then the entry's
    own (`--variant`); `disagg` makes the entry's fleet and pool disaggregated. A variant item starting
    with `@` is a top-level gateway key instead (`@state.share_prefix_index=false`, on top of
    `--gateway-set`), except `@instances=N`: the entry's gateway processes (instead of
    `--gateway-instances`).

    The gateway reads its pool's `slo` in wall seconds, like every timer of its config, while the
    report's `--slo-ttft-ms` / `--slo-tpot-ms` are simulated: at `--speed 0.5` a 2 s objective is 4 s of
    wall time. Without a `--gateway-config` template, the pool's `slo` is therefore set to the report's
    objectives ÷ the time scale (what the gateway's SLO-bounded queue waits and learned cap act on);
    `--pool-set slo=…` still overrides it. A template keeps its own `slo`."""
    config_path = config or args.gateway_config
    overrides = {} if config_path else wall_slo(args)
    pool_items = [item for item in variant or [] if not item.startswith("@")]
    merge_into(overrides, pool_overrides([*args.pool_set, *pool_items]))
    gateway_items = [item[1:] for item in variant or [] if item.startswith("@")]
    instances = [item for item in gateway_items if item.partition("=")[0].strip() == "instances"]
    settings = pool_overrides(
        [*args.gateway_set, *(i for i in gateway_items if i not in instances)], "--gateway-set"
    )
    return GatewayOptions(
        config_path=config_path,
        policy=policy,
        pool_overrides=overrides,
        disagg=disagg,
        settings_overrides=settings,
        instances=_instances(instances[-1]) if instances else None,
    )


def _instances(item: str) -> int:
    """A variant's `@instances=N` (N >= 1)."""
    value = yaml.safe_load(item.partition("=")[2])
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--variant @{item!r}: instances must be an integer >= 1")
    return value


def wall_slo(args: argparse.Namespace) -> dict[str, Any]:
    """`{slo: {ttft_s, tpot_s}}`: the report's objectives in the gateway's wall seconds."""
    scale = time_scale(args, local=True)
    return {"slo": {"ttft_s": args.slo_ttft_ms / 1000.0 / scale, "tpot_s": args.slo_tpot_ms / 1000.0 / scale}}


def disagg_specs(args: argparse.Namespace) -> list[DisaggSpec]:
    """Every `--disagg` entry, with `--disagg-protocol` and `--kv-link` as defaults (bench/disagg.py)."""
    if args.kv_link is not None:
        check_link(args.kv_link)
    return [parse_disagg(item, args.disagg_protocol, args.kv_link) for item in args.disagg]


def pinning(args: argparse.Namespace) -> Pinning:
    return Pinning(gateway_cpu=args.pin_gateway, others_cpu=args.pin_others)


def workload(args: argparse.Namespace) -> Workload:
    if args.trace:
        return TraceWorkload(args.trace, repeat=args.arrival != "trace")
    if args.workload not in PRESETS:
        raise ValueError(f"unknown workload {args.workload!r}; known: {', '.join(PRESETS)}")
    return build_workload(args.workload, args.param)


def time_scale(args: argparse.Namespace, local: bool) -> float:
    if args.time_scale is not None:
        return float(args.time_scale)
    return float(args.speed) if local and args.speed else 1.0


def levels(args: argparse.Namespace) -> list[float]:
    if args.arrival == "closed":
        return [float(c) for c in args.concurrency]
    if args.arrival == "trace":
        return [1.0]
    return list(args.rate)


def experiment(args: argparse.Namespace, local: bool) -> Experiment:
    load_workload = workload(args)
    trace_times: tuple[float, ...] = ()
    if args.arrival == "trace":
        if not isinstance(load_workload, TraceWorkload):
            raise ValueError("--arrival trace needs --trace FILE with at_s timestamps")
        trace_times = load_workload.arrival_times_s()
    if args.gateway_instances < 1:
        raise ValueError(f"--gateway-instances must be >= 1, got {args.gateway_instances}")
    if args.gateway_instances > 1 and not local:
        raise ValueError("--gateway-instances starts gateways of the local fleet (drop --url)")
    if args.disagg and not local:
        raise ValueError("--disagg starts a local disaggregated fleet (drop --url)")
    if args.fault and not local:
        raise ValueError("--fault needs the local fleet the benchmark starts (drop --url)")
    if args.client == "raw" and args.no_stream:
        raise ValueError("--client raw sends streamed requests only; drop --no-stream or use --client httpx")
    requests = args.requests
    if requests is None and args.duration_s is None:
        requests = len(trace_times) if trace_times else 200
    headers = {}
    for item in args.header:
        name, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"--header {item!r} is not NAME:VALUE")
        headers[name.strip()] = value.strip()
    return Experiment(
        workload=load_workload,
        load=LoadSpec(
            arrival=args.arrival,
            requests=requests,
            duration_s=args.duration_s,
            warmup_requests=args.warmup_requests,
            warmup_s=args.warmup_s,
            burstiness=args.burstiness,
            spike_factor=args.spike_factor,
            spike_start_s=args.spike_start_s,
            spike_duration_s=args.spike_duration_s,
            trace_times_s=trace_times,
            seed=args.seed,
        ),
        client=ClientOptions(
            model=args.model,
            stream=not args.no_stream,
            timeout_s=args.timeout_s,
            api_key=args.api_key,
            retry_after_retries=args.honour_retry_after,
            extra_headers=headers,
            keep_alive=args.keep_alive,
        ),
        slo=Slo(ttft_s=args.slo_ttft_ms / 1000.0, tpot_s=args.slo_tpot_ms / 1000.0),
        priority_mix=parse_priority_mix(args.priority_mix),
        api=args.api,
        client_kind=args.client,
        time_scale=time_scale(args, local),
        sample_interval_s=args.sample_interval_s,
        progress=not args.quiet,
        schedule=parse_schedule(args.fault, args.replicas) if local else (),
        poison=poison(args),
    )


def dump_workload(exp: Experiment, path: str, count: int) -> int:
    from itertools import islice

    from bench.presets import write_trace

    return write_trace(Path(path), islice(exp.specs(), count))
