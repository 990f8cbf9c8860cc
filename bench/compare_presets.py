"""`bench compare --preset NAME`: a named comparison, written as the command-line options it stands for.

A preset is an argument list put in front of the user's own, so every option given on the command line
overrides it (whatever its position), and the report's `argv` plus this table reproduce the run. Of
the options that add up, `--fault` and `--variant` given by the user replace the preset's schedule and
configs; `--pool-set`, `-p` and `--engine-arg` add to the preset's (a later key wins).

    faults   goodput under faults: continuation on vs off × attribution on vs off, same fleet, load, seed,
             fault schedule and poison fraction (docs/BENCHMARKS.md, "Goodput under faults")
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

FAULTS: tuple[str, ...] = (
    # fleet: three fixed-delay engines, a stream of 128 tokens takes ~1.1 s
    "--replicas", "3", "--first-token-delay-ms", "50", "--token-delay-ms", "8",
    # load: fresh 64-token prompts, 128 tokens out, 8 req/s Poisson for 40 s, streamed, raw client
    "--workload", "no-sharing", "-p", "prompt_tokens=64", "-p", "output_tokens=128",
    "--arrival", "poisson", "--rate", "8", "--duration-s", "40", "--warmup-requests", "16",
    "--client", "raw", "--slo-ttft-ms", "500", "--slo-tpot-ms", "25", "--seed", "14",
    # the pool: shipped defaults, but first-token and idle deadlines of 1 s and health checks every 1 s
    "--pool-set", "timeouts={ttft_s: 1, idle_s: 1}", "--pool-set", "health={interval_s: 1}",
    # faults: a flaky replica from 5 s, replica 0 killed at 15 s and started again at 27 s, 5 % poison
    "--fault", "at=5s replica=1 set=crash_after_tokens:32,crash_rate:0.2",
    "--fault", "at=15s kill=0",
    "--fault", "at=27s restart=0",
    "--poison-fraction", "0.05", "--poison-effect", "stall",
    # the configs
    "--variant", "contained:",
    "--variant", "no-continuation:continuation.enabled=false",
    "--variant", "breaker-as-was:attribution.enabled=false",
    "--variant", "neither:continuation.enabled=false;attribution.enabled=false",
)  # fmt: skip

PRESETS: dict[str, tuple[str, ...]] = {"faults": FAULTS}
REPLACED = ("--fault", "--variant")


def describe() -> str:
    return "; ".join(f"{name}: {' '.join(argv)}" for name, argv in PRESETS.items())


def _preset_name(args: Sequence[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "--preset" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--preset="):
            return arg.partition("=")[2]
    return None


def _without(preset: Sequence[str], flags: set[str]) -> list[str]:
    """The preset's argument list without the (flag, value) pairs of `flags`."""
    out: list[str] = []
    i = 0
    while i < len(preset):
        if preset[i] in flags:
            i += 2
            continue
        out.append(preset[i])
        i += 1
    return out


def expand(args: Sequence[str]) -> list[str]:
    """`args` with the named preset's options in front (see the module docstring)."""
    name = _preset_name(args)
    if name is None:
        return list(args)
    if name not in PRESETS:
        raise SystemExit(f"bench compare: unknown --preset {name!r}; known: {', '.join(PRESETS)}")
    given = {a.partition("=")[0] for a in args}
    replaced = {flag for flag in REPLACED if flag in given}
    return [*_without(PRESETS[name], replaced), *args]


class PresetParser(argparse.ArgumentParser):
    """An argument parser whose `--preset NAME` (when it has that option) puts the preset's options in
    front of the others. As a subcommand's parser it also records that subcommand's own arguments
    (presets expanded) as `command_argv`, whichever command line led to it (`llm-gateway bench …`,
    `python -m bench …`), so a report can print the line that reproduces it."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        raw = list(sys.argv[1:] if args is None else args)
        if any("--preset" in action.option_strings for action in self._actions):
            raw = expand(raw)
        parsed, rest = super().parse_known_args(raw, namespace)
        parsed.command_argv = raw
        return parsed, rest
