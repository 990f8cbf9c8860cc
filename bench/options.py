"""What the command-line options shared by `bench run` and `bench compare` (declared in
`bench.run_arguments`) build: the fleet options, the experiment (workload, load, client, SLO) and the
load levels."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import yaml

from bench.client import ClientOptions
from bench.disagg import DisaggSpec, check_link, parse_disagg
from bench.execute import Experiment, LoadSpec
from bench.faults import Poison, parse_schedule
from bench.fleet import Pinning
from bench.fleet_config import EngineOptions, GatewayOptions, merge_into
from bench.presets import PRESETS, TraceWorkload, build_workload
from bench.stats import Slo
from bench.workload import Workload, parse_priority_mix


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
        slo=slo_of(args),
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


def slo_of(args: argparse.Namespace) -> Slo:
    """The report's objectives (simulated seconds): `--slo-ttft-ms` / `--slo-tpot-ms`, and each
    `--class-slo CLASS=TTFT_MS[:TPOT_MS]` — with a `--priority-mix`, for one of its classes; without
    one, for any class a trace's requests carry. ValueError for a malformed, non-positive or non-finite
    objective, an unknown class or one given twice. `bench sweep` finds its knee by these too."""
    mix = parse_priority_mix(args.priority_mix)
    classes: list[tuple[str, float, float]] = []
    for item in args.class_slo:
        name, sep, objectives = item.partition("=")
        ttft_ms, _, tpot_ms = objectives.partition(":")
        try:
            ttft_s, tpot_s = float(ttft_ms) / 1000.0, float(tpot_ms or args.slo_tpot_ms) / 1000.0
        except ValueError:
            ttft_s = tpot_s = -1.0
        if not sep or not 0 < ttft_s < math.inf or not 0 < tpot_s < math.inf:
            raise ValueError(f"--class-slo {item!r} is not CLASS=TTFT_MS[:TPOT_MS] with positive objectives")
        if (mix and name not in mix) or name in (c[0] for c in classes):
            raise ValueError(f"--class-slo {item!r}: {name!r} is not a --priority-mix class or given twice")
        classes.append((name, ttft_s, tpot_s))
    return Slo(args.slo_ttft_ms / 1000.0, args.slo_tpot_ms / 1000.0, tuple(classes))
