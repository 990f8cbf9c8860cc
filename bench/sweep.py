"""`bench sweep`: one workload from below to past the knee, the pool's default admission against none,
in one table and one picture (SLO goodput and refusals against offered load).

1. The knee (`bench.knee`): the highest offered rate at which at least `--knee-slo-ratio` (0.95) of the
   requests meet the SLO with no admission — doubling (or halving) from `--knee-start` (4 req/s) until
   the share crosses the ratio, then bisection to `--knee-precision` (0.1, relative), at most 256× from
   the start (`--knee-max` lowers the top). Each probe is a fresh fleet and half the main window (half
   the measured requests or seconds after the warm-up, which is kept), or `--knee-duration-s`.
   `--knee RATE` skips the search.
2. The sweep: every `--levels` factor (0.5 0.75 1 1.25 1.5 2 2.5 3) × the knee, for each entry:
   `defaults` (the pool as configured, `--pool-set` included) and `no-admission` (the same pool with
   `NO_ADMISSION_OVERRIDES`: no learned cap and no configured cap, so no replica is ever full and the
   gateway queues and refuses nothing), then every `--variant`; `--rounds R` as in compare. A fresh
   fleet for every run (`bench.commands.run_entries`). Each run lasts `--duration-s` (default 60 s:
   `DEFAULT_DURATION_S`), or `--requests` when given.
3. The report (bench/sweep_report.py, bench/sweep_plot.py): the command line that reproduces it (and
   the same with `--knee` set to the knee found), the knee's probes, one table of the sweep, the usual
   per-run report below it, `sweep` in report.json and `sweep.png`.

Rates, windows and SLOs are in simulated units with `--speed` (bench/execute.py), like every bench rate.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench import options, run_arguments
from bench.commands import Entry, finish, parse_variant, run_entries, run_on_fleet
from bench.execute import Experiment
from bench.fleet import pin_self
from bench.fleet_config import GatewayOptions
from bench.knee import DEFAULT_PRECISION, DEFAULT_SLO_RATIO, KneeSearch, Probe, find_knee
from bench.report import output_dir
from bench.summary import RunResult
from bench.sweep_plot import write_sweep_plot
from bench.sweep_report import knee_goodput, knee_lines, probe_table, render_lead, sweep_json, sweep_rows

PROG = "llm-gateway bench sweep"
DEFAULT_LEVELS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
DEFAULT_KNEE_START = 4.0
DEFAULT_DURATION_S = 60.0
"""A sweep's window when neither `--duration-s` nor `--requests` is given: a duration, because a fixed
count of requests sent past the knee is over before a queue can build."""
DEFAULTS = "defaults"
NO_ADMISSION = "no-admission"
NO_ADMISSION_OVERRIDES = ("latency_model.adaptive_cap=false", "max_concurrency_per_replica=null")
"""Pool overrides that make the gateway admit everything: admission queues (and so refuses) only when
no replica has a free slot, and without a cap every replica always has one (early refusal, queue
timeouts and prefix waits all act on queued requests)."""
RATE_ARRIVALS = ("poisson", "gamma", "constant", "step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help="gateway policy of every entry (default: the pool's)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:KEY=YAML;…",
        help="a further entry beside defaults and no-admission, as in compare (repeat)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="repeat with rotated order (default 1)")
    g = parser.add_argument_group("knee and load levels")
    g.add_argument("--knee", type=float, default=None, metavar="RATE", help="the knee (req/s): no search")
    g.add_argument(
        "--knee-start", type=float, default=DEFAULT_KNEE_START, metavar="RATE", help="first probe (default 4)"
    )
    g.add_argument(
        "--knee-max", type=float, default=None, metavar="RATE", help="highest probe (default 256×)"
    )
    g.add_argument(
        "--knee-slo-ratio",
        type=float,
        default=DEFAULT_SLO_RATIO,
        help="share of requests within the SLO at the knee (default 0.95)",
    )
    g.add_argument(
        "--knee-precision", type=float, default=DEFAULT_PRECISION, help="bisect to this relative gap (0.1)"
    )
    g.add_argument(
        "--knee-duration-s", type=float, default=None, help="each probe's --duration-s (default: half window)"
    )
    g.add_argument(
        "--levels",
        type=float,
        nargs="+",
        default=list(DEFAULT_LEVELS),
        metavar="X",
        help="offered load as multiples of the knee (default 0.5 0.75 1 1.25 1.5 2 2.5 3)",
    )
    run_arguments.add_fleet_arguments(parser)
    run_arguments.add_experiment_arguments(parser)
    parser.set_defaults(rate=None)


def check(args: argparse.Namespace) -> None:
    """The options a sweep cannot take, as a `ValueError` naming them."""
    if args.rate is not None:
        raise ValueError("bench sweep sets its rates from the knee: use --knee / --levels, not --rate")
    if args.arrival not in RATE_ARRIVALS:
        raise ValueError(f"bench sweep offers rates: --arrival {', '.join(RATE_ARRIVALS)}")
    if args.disagg:
        raise ValueError("bench sweep runs aggregated fleets (--replicas); drop --disagg")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if any(level <= 0 for level in args.levels):
        raise ValueError("--levels must be > 0")
    if args.knee is not None and args.knee <= 0:
        raise ValueError("--knee must be > 0")


def sweep_entries(args: argparse.Namespace) -> tuple[list[Entry], dict[str, list[str]]]:
    """`defaults`, `no-admission`, then every `--variant`: the entries, and each one's overrides."""
    named = [(DEFAULTS, []), (NO_ADMISSION, list(NO_ADMISSION_OVERRIDES))]
    named += [parse_variant(item) for item in args.variant]
    labels = [label for label, _ in named]
    if len(set(labels)) != len(labels):
        raise ValueError(f"sweep entries need distinct labels, got {', '.join(labels)}")
    entries: list[Entry] = [
        (label, options.gateway_options(args, policy=args.policy, variant=items), False)
        for label, items in named
    ]
    return entries, dict(named)


def level_rates(levels: Sequence[float], knee: float) -> list[float]:
    """The offered rates: each level × the knee, ascending, each once."""
    return sorted({level * knee for level in levels})


def probe_experiment(exp: Experiment, duration_s: float | None) -> Experiment:
    """`exp` with a knee probe's window: `duration_s` when given, else half the measured part of the
    main one (requests or seconds after the warm-up; the warm-up is kept)."""
    load = exp.load
    if duration_s is not None:
        return replace(exp, load=replace(load, duration_s=duration_s, requests=None))
    requests = duration = None
    if load.requests is not None:
        requests = load.warmup_requests + max(1, math.ceil((load.requests - load.warmup_requests) / 2))
    if load.duration_s is not None:
        duration = load.warmup_s + max(0.0, load.duration_s - load.warmup_s) / 2
    return replace(exp, load=replace(load, requests=requests, duration_s=duration))


def _print_probe(probe: Probe) -> None:
    verdict = "meets" if probe.meets else "misses"
    print(
        f"bench sweep: knee probe ({probe.step}) at {probe.rate:.2f} req/s: "
        f"{probe.met_ratio:.1%} within the SLO, {verdict} the ratio",
        file=sys.stderr,
    )


def search_knee(
    args: argparse.Namespace, exp: Experiment, gateway: GatewayOptions | None, out: Path
) -> tuple[KneeSearch, dict[float, RunResult]]:
    """Run the knee search (module docstring), each probe on a fresh fleet behind `gateway`; the
    search, and each probe's run by rate."""
    probe_exp = probe_experiment(exp, args.knee_duration_s)
    runs: dict[float, RunResult] = {}

    def measure(rate: float) -> float:
        log_dir = out / "logs" / f"knee-{len(runs):02d}"
        result = run_on_fleet(
            args,
            label=NO_ADMISSION,
            gateway=gateway,
            oracle=False,
            level=rate,
            exp=probe_exp,
            log_dir=log_dir,
        )
        runs[rate] = result
        for warning in result.summary.get("warnings", []):
            print(f"bench: warning: knee probe at {rate:.2f} req/s: {warning}", file=sys.stderr)
        return float(result.summary["goodput"]["attainment_ratio"])

    search = find_knee(
        measure,
        start=args.knee_start,
        slo_ratio=args.knee_slo_ratio,
        precision=args.knee_precision,
        max_rate=args.knee_max,
        on_probe=_print_probe,
    )
    return search, runs


def command_line(argv: Sequence[str], knee: float | None = None) -> str:
    """The sweep's command (`argv`: its own arguments), with `--knee` appended when given."""
    items = [*argv, *(("--knee", f"{knee:.6g}") if knee is not None else ())]
    return f"{PROG} {shlex.join(items)}".rstrip()


def sweep_command(args: argparse.Namespace) -> int:
    check(args)
    if args.requests is None and args.duration_s is None:
        args.duration_s = DEFAULT_DURATION_S
    exp = options.experiment(args, local=True)
    entries, overrides = sweep_entries(args)
    out = Path(args.out) if args.out else output_dir("sweep", args.name or exp.workload.name)
    out.mkdir(parents=True, exist_ok=True)
    pin_self(args.pin_others)
    argv = list(getattr(args, "command_argv", []))
    search: KneeSearch | None = None
    probe_runs: dict[float, RunResult] = {}
    knee = args.knee
    if knee is None:
        no_admission = next(gateway for label, gateway, _ in entries if label == NO_ADMISSION)
        search, probe_runs = search_knee(args, exp, no_admission, out)
        if search.knee is None:
            lowest = min(p.rate for p in search.probes)
            print(
                f"bench sweep: no probed rate, down to {lowest:.3g} req/s, had {args.knee_slo_ratio:.0%} "
                "of its requests within the SLO: no knee, no sweep",
                file=sys.stderr,
            )
            return 1
        knee = search.knee
        print(f"bench sweep: knee {knee:.2f} req/s after {len(search.probes)} probes", file=sys.stderr)
    results = run_entries(args, entries, level_rates(args.levels, knee), exp, out)
    probe_goodput = {rate: float(r.summary["goodput"]["requests_per_s"]) for rate, r in probe_runs.items()}
    reference = knee_goodput(results, knee, NO_ADMISSION, probe_goodput.get(knee))
    rows = sweep_rows(results, knee, reference)
    command = command_line(argv)
    lead = render_lead(
        command=command,
        command_with_knee=command_line(argv, knee) if search is not None else None,
        knee_text=knee_lines(
            knee, search, slo_ratio=args.knee_slo_ratio, precision=args.knee_precision, reference=NO_ADMISSION
        ),
        probes=probe_table(search, probe_goodput) if search is not None else "",
        rows=rows,
        entries=overrides,
        reference=NO_ADMISSION,
    )
    settings = {
        "slo_ratio": args.knee_slo_ratio,
        "precision": args.knee_precision,
        "start": args.knee_start,
        "max_rate": args.knee_max,
        "levels": list(args.levels),
    }
    extra = {
        "sweep": sweep_json(
            command=command,
            knee=knee,
            search=search,
            goodput_by_rate=probe_goodput,
            knee_goodput_rps=reference,
            rows=rows,
            entries=overrides,
            settings=settings,
        )
    }
    plot = None if args.no_plots else write_sweep_plot(out, rows, knee, reference)
    return finish(
        "sweep", args, exp, results, out, lead=lead, extra=extra, written_before=[plot] if plot else []
    )
