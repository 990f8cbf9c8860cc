"""`bench run` and `bench compare`.

run: one target (a URL, or a local fleet the benchmark starts), one workload, one or more load levels
(`--rate 2 4 8` is a sweep: one run per level, each on a freshly started fleet).

compare: several policies or gateway configs on the same fleet shape, workload, seed and load levels,
one report. Runs are *sequential with a fresh fleet for every run* (engines and gateway restarted), not
interleaved request by request: the engines' prefix caches and queues are the very state being
compared, so interleaving would let one policy warm the caches (or fill the queues) the other one is
measured on. To spread slow machine noise evenly, `--rounds R` repeats the whole comparison R times and
rotates the order of the entries each round (A B C, B C A, C A B); every round is its own row.

Special entries: `oracle` routes client-side straight to the engines, to the replica holding the longest
prefix (the hit-ratio reference); `direct` sends to the first engine with no gateway.

Variants: `--variant LABEL:KEY=YAML;KEY=YAML` is an entry whose pool gets those overrides on top of
`--pool-set` (dotted keys reach into a mapping: `continuation.enabled=false`); `LABEL:` alone is the
pool as configured. A variant is not a `--policy` entry's: it runs the pool's policy (the default, or
`--pool-set policy=NAME`) unless it sets `policy=NAME` (`--policy` names entries of their own).
Faults (`--fault`, `--poison-fraction`; bench/faults.py) apply to every entry alike, on its own fresh
fleet. `--preset faults` is a whole comparison (bench/compare_presets.py).

Disaggregated fleets: `--disagg [LABEL=]P:D[@LINK]` (bench/disagg.py). In run, the fleet is P prefill +
D decode engines behind a disaggregated pool (`--replicas` is ignored); in compare, every `--disagg` is
an entry of its own on its own fresh fleet of P + D engines, beside aggregated entries of `--replicas`
engines (`--variant agg:` is the plain pool), so "4 replicas vs 2 prefill + 2 decode" is one compare.
Each run's summary carries `gpus`, the engines it ran on, and the report shows goodput per GPU.

`--gateway-instances N` (both commands, local fleet): every gateway entry runs N gateway processes with
the same config over the same engines, and the load goes to them in turn, one request each; `oracle` and
`direct` have no gateway and ignore it. `--gateway-set KEY=YAML` sets a top-level key of every entry's
gateway config (`state.backend=redis`: the instances share state through the Redis at the config's
`state.url`, under a fresh key prefix per fleet). In a variant, `@KEY=YAML` sets a top-level key for
that entry only and `@instances=N` its number of gateways, so "1 instance vs 3 without sharing vs 3
sharing the prefix index" is one compare:
`--variant 'one:@instances=1' --variant 'three:@instances=3;@state.share_prefix_index=false'
--variant 'shared:@instances=3'` with `--gateway-set state.backend=redis`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import compare_presets, options, run_arguments
from bench.execute import Experiment, Target, run_experiment
from bench.fleet import Fleet, pin_self
from bench.fleet_config import GatewayOptions
from bench.report import environment, output_dir, write_report
from bench.summary import RunResult

CLIENT_SIDE = ("oracle", "direct")

Entry = tuple[str, GatewayOptions | None, bool]
"""One compared entry: its label, its gateway (None: no gateway) and whether it is the oracle."""


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="target URL (default: start a local fleet)")
    parser.add_argument(
        "--engine-metrics", action="append", default=[], metavar="URL", help="engine to scrape (repeat)"
    )
    parser.add_argument("--policy", default=None, help="gateway policy, or oracle / direct (no gateway)")
    run_arguments.add_fleet_arguments(parser)
    run_arguments.add_experiment_arguments(parser)


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", action="append", nargs="+", default=[], help="policies to compare (and oracle, direct)"
    )
    parser.add_argument(
        "--config", action="append", default=[], metavar="LABEL=PATH", help="gateway configs to compare"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:KEY=YAML;…",
        help="a config: the pool with these overrides, e.g. 'no-cont:continuation.enabled=false'; "
        "'@KEY=YAML' sets a top-level gateway key, '@instances=N' the entry's gateway processes (repeat)",
    )
    parser.add_argument(
        "--preset",
        default=None,
        choices=tuple(compare_presets.PRESETS),
        help="a named comparison; options given override it — " + compare_presets.describe(),
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat with rotated order (default 1)")
    run_arguments.add_fleet_arguments(parser)
    run_arguments.add_experiment_arguments(parser)


def run_on_fleet(
    args: argparse.Namespace,
    *,
    label: str,
    gateway: GatewayOptions | None,
    oracle: bool,
    level: float,
    exp: Experiment,
    log_dir: Path,
) -> RunResult:
    """Start a fresh fleet, run one experiment on it, stop the fleet."""
    log_dir.mkdir(parents=True, exist_ok=True)
    disagg = gateway.disagg if gateway is not None else None
    replicas = disagg.replicas if disagg is not None else args.replicas
    fleet = Fleet(
        replicas,
        options.engine_options(args),
        gateway,
        pinning=options.pinning(args),
        base_port=args.base_port,
        log_dir=log_dir,
        gateways=args.gateway_instances,
    )
    with fleet:
        target = Target(
            url=None if oracle else fleet.url,
            engines=fleet.engines,
            oracle=oracle,
            fleet=fleet,
            also_urls=() if oracle else tuple(fleet.gateway_urls[1:]),
            replica_ids=tuple(fleet.answering_engines),
        )
        result = run_experiment(label, level, exp, target)
    result.params["fleet"] = {
        "replicas": replicas,
        "gateway_instances": len(fleet.gateway_urls),
        "engine": options.engine_options(args).argv(0, 0),
        **({"disaggregation": disagg.describe()} if disagg is not None else {}),
    }
    result.summary["gpus"] = replicas
    return result


def parse_variant(item: str) -> tuple[str, list[str]]:
    """`LABEL:KEY=YAML;KEY=YAML` → (label, ["KEY=YAML", …]); `LABEL:` alone has no overrides."""
    label, sep, rest = item.partition(":")
    if not sep or not label.strip():
        raise ValueError(f"--variant {item!r} is not LABEL:KEY=YAML;KEY=YAML (or LABEL:)")
    return label.strip(), [part.strip() for part in rest.split(";") if part.strip()]


def _entries(args: argparse.Namespace) -> list[Entry]:
    """(label, gateway options or None, oracle?) for every compared entry, in the order given."""
    entries: list[Entry] = []
    for name in (p for group in args.policy for p in group):
        if name in CLIENT_SIDE:
            entries.append((name, None, name == "oracle"))
        else:
            entries.append((name, options.gateway_options(args, policy=name), False))
    for item in args.config:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).stem, item
        entries.append((label, options.gateway_options(args, config=path), False))
    for item in args.variant:
        label, overrides = parse_variant(item)
        entries.append((label, options.gateway_options(args, variant=overrides), False))
    for spec in options.disagg_specs(args):
        entries.append((spec.label, options.gateway_options(args, disagg=spec), False))
    labels = [e[0] for e in entries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"compared entries need distinct labels, got {', '.join(labels)}")
    return entries


def finish(
    command: str,
    args: argparse.Namespace,
    exp: Experiment,
    results: list[RunResult],
    out: Path,
    *,
    lead: str = "",
    extra: dict[str, Any] | None = None,
    written_before: Sequence[Path] = (),
) -> int:
    """Write the report (`lead`: markdown under its title; `extra`: keys added to its JSON), print it
    and the runs' warnings; 0 when every run had a successful request, else 1."""
    meta: dict[str, Any] = {
        "command": command,
        "argv": sys.argv[1:],
        **({"preset": list(compare_presets.PRESETS[args.preset])} if getattr(args, "preset", None) else {}),
        "params": exp.params(),
        "environment": environment(),
    }
    title = f"bench {command}: {args.name or exp.workload.name}"
    written = [*written_before]
    written += write_report(out, title, meta, results, plots=not args.no_plots, lead=lead, extra=extra)
    print((out / "report.md").read_text())
    for r in results:
        for warning in r.summary.get("warnings", []):
            print(f"bench: warning: {r.label}: {warning}", file=sys.stderr)
    print("written: " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0 if all(r.summary["ok"] for r in results) else 1


def run_command(args: argparse.Namespace) -> int:
    local = args.url is None
    exp = options.experiment(args, local=local)
    specs = options.disagg_specs(args)
    if len(specs) > 1 or (specs and args.policy in CLIENT_SIDE):
        raise ValueError("bench run takes one --disagg fleet, behind the gateway (compare several)")
    disagg = specs[0] if specs else None
    out = Path(args.out) if args.out else output_dir("run", args.name or exp.workload.name)
    out.mkdir(parents=True, exist_ok=True)
    if args.dump_workload:
        count = options.dump_workload(exp, args.dump_workload, exp.load.requests or 1000)
        print(f"wrote {count} requests to {args.dump_workload}", file=sys.stderr)
    pin_self(args.pin_others)
    results = []
    for i, level in enumerate(options.levels(args)):
        label = args.policy or (disagg.label if disagg else "target" if not local else "gateway")
        if not local:
            engines = {u.split("://", 1)[-1].rstrip("/"): u.rstrip("/") for u in args.engine_metrics}
            results.append(run_experiment(label, level, exp, Target(args.url, engines)))
            continue
        gateway = (
            None
            if args.policy in CLIENT_SIDE
            else options.gateway_options(args, policy=args.policy, disagg=disagg)
        )
        oracle = args.policy == "oracle"
        results.append(
            run_on_fleet(
                args,
                label=label,
                gateway=gateway,
                oracle=oracle,
                level=level,
                exp=exp,
                log_dir=out / "logs" / f"{i:02d}",
            )
        )
    return finish("run", args, exp, results, out)


def compare_command(args: argparse.Namespace) -> int:
    entries = _entries(args)
    if len(entries) < 1:
        print(
            "bench compare: give --policy NAME …, --config LABEL=PATH, --variant LABEL:KEY=YAML, "
            "--disagg P:D or --preset",
            file=sys.stderr,
        )
        return 2
    exp = options.experiment(args, local=True)
    out = Path(args.out) if args.out else output_dir("compare", args.name or exp.workload.name)
    out.mkdir(parents=True, exist_ok=True)
    pin_self(args.pin_others)
    results = run_entries(args, entries, options.levels(args), exp, out)
    return finish("compare", args, exp, results, out)


def run_entries(
    args: argparse.Namespace, entries: Sequence[Entry], levels: Sequence[float], exp: Experiment, out: Path
) -> list[RunResult]:
    """Every entry at every level, each run on a fresh fleet, `args.rounds` times with the order of the
    entries rotated each round (A B C, B C A, …; a round's runs are labelled `LABEL #k` when there are
    several); sorted by level, then by the order of `entries`."""
    results: list[RunResult] = []
    for round_index in range(args.rounds):
        shift = round_index % len(entries)
        order = [*entries[shift:], *entries[:shift]]
        for level in levels:
            for label, gateway, oracle in order:
                shown = label if args.rounds == 1 else f"{label} #{round_index + 1}"
                log_dir = out / "logs" / f"{len(results):02d}-{label}"
                results.append(
                    run_on_fleet(
                        args,
                        label=shown,
                        gateway=gateway,
                        oracle=oracle,
                        level=level,
                        exp=exp,
                        log_dir=log_dir,
                    )
                )
    labels = [e[0] for e in entries]
    results.sort(key=lambda r: (r.level or 0.0, labels.index(r.label.split(" #")[0])))
    return results
