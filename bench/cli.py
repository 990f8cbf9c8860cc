"""`llm-gateway bench …` (also `python -m bench …`): the load generator and benchmark suite.

    bench run       one target (a URL or a local fleet it starts), one workload, one or more load levels
    bench compare   several policies / gateway configs on the same fleet shape and workload, one report
    bench sweep     one workload from 0.5× to 3× of the knee it finds, default admission vs none
    bench overhead  direct vs through the gateway vs two bare proxies (aiohttp; the gateway's own
                    stack): added latency, CPU, max req/s, streams; `--profile-gateway` for CPU per
                    serve-path stage
    bench plan-check  the capacity plan of a disaggregated pool against the mock's physics (simulated time)

Wire-up: `add_arguments(parser)` adds the subcommands to a parser, `run(args)` runs the chosen one and
returns the exit code (0 ok, 1 a run had no successful request, 2 bad arguments, 130 interrupted).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from types import FrameType

from bench import commands, overhead, plan_check, sweep
from bench.compare_presets import PresetParser

Handler = Callable[[argparse.Namespace], int]


_SUBCOMMANDS: tuple[tuple[str, str, str | None, Callable[[argparse.ArgumentParser], None], Handler], ...] = (
    ("run", "one target, one workload", commands.__doc__, commands.add_run_arguments, commands.run_command),
    (
        "compare",
        "policies or configs side by side",
        commands.__doc__,
        commands.add_compare_arguments,
        commands.compare_command,
    ),
    (
        "sweep",
        "load sweep around the knee: defaults vs no admission",
        sweep.__doc__,
        sweep.add_arguments,
        sweep.sweep_command,
    ),
    (
        "overhead",
        "gateway overhead vs direct-to-engine and two bare proxies (aiohttp, and the gateway's stack)",
        overhead.__doc__,
        overhead.add_arguments,
        overhead.run,
    ),
    (
        "plan-check",
        "planner predictions vs the physics core, disaggregated pools",
        plan_check.__doc__,
        plan_check.add_arguments,
        plan_check.run,
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(
        dest="bench_command",
        required=True,
        metavar="{run,compare,sweep,overhead,plan-check}",
        parser_class=PresetParser,
    )
    for name, help_text, description, add_args, handler in _SUBCOMMANDS:
        subparser = sub.add_parser(
            name,
            help=help_text,
            description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_args(subparser)
        subparser.set_defaults(bench_func=handler)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; SIGTERM and Ctrl-C unwind through the fleet's cleanup."""
    handler: Handler = args.bench_func
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("\nbench: interrupted; local processes stopped", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
