"""`llm-gateway plan`: the offline capacity planner on the command line.

The gateway's CLI owns the parser; it calls `add_arguments(subparser)` and later `run(args)`. Inputs
come from `--config FILE` (YAML, see `capacity/examples/worked_example.yaml`); without `--config` the
bundled worked example (DESIGN.md §7) is the base, and every override flag replaces one key of it.
Destinations are prefixed `plan_` so they cannot collide with the gateway's own options.

Exit status: 0 with a plan, 2 when an input is invalid or cannot be planned (the message names the
key, and the flag when the value came from one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capacity.disagg import build_disagg_plan
from capacity.disagg_report import disagg_document, render_disagg_table
from capacity.errors import InputError
from capacity.inputs import PlanInputs
from capacity.loader import WORKED_EXAMPLE, load_inputs
from capacity.plan import build_plan
from capacity.report import render_json, render_table

EXIT_OK = 0
EXIT_INPUT_ERROR = 2

# flag, input key, type, help
_OVERRIDES: tuple[tuple[str, str, type, str], ...] = (
    ("--arrival-rate", "workload.arrival_rate_per_s", float, "λ, requests per second"),
    ("--input-tokens", "workload.mean_input_tokens", float, "mean input tokens ī"),
    ("--output-tokens", "workload.mean_output_tokens", float, "mean output tokens ō"),
    ("--tpot-max-ms", "slo.tpot_max_ms", float, "SLO: max time per output token, ms"),
    ("--min-stream-tps", "slo.min_stream_tokens_per_s", float, "SLO: min decode tok/s per stream"),
    ("--e2e-p95-s", "slo.e2e_p95_s", float, "SLO: end-to-end p95, seconds"),
    ("--ttft-p95-s", "slo.ttft_p95_s", float, "SLO: TTFT p95, seconds (rows need ttft_p95_s)"),
    ("--ttft-mean-s", "throughput.ttft_mean_s", float, "measured mean TTFT under load, seconds"),
    ("--headroom", "headroom.ratio", float, "headroom r: N = ceil(N_base * (1 + r))"),
    ("--min-replicas", "headroom.min_replicas", int, "never plan fewer replicas"),
    ("--gpu-memory-gb", "gpu.memory_gb", float, "GPU memory, GB (10^9 bytes)"),
    ("--overhead-gb", "gpu.overhead_gb", float, "runtime overhead allowance, GB"),
    ("--gpu-price", "gpu.usd_per_hour", float, "GPU-hour price, USD"),
    ("--spike-factor", "spike.factor", float, "k of the k-fold arrival spike"),
    ("--cold-start-s", "spike.cold_start_s", float, "seconds until a new replica serves"),
    ("--target-utilisation", "spike.target_utilisation_ratio", float, "rho to carry the spike at"),
    ("--compare-batch", "cost.compare_batch", int, "measured batch to compare the cost with"),
    ("--useful-load", "cost.useful_load_ratio", float, "fraction of capacity that is goodput"),
    ("--link-gb-per-s", "disaggregation.link_gb_per_s", float, "disaggregated: KV link GB/s"),
    ("--prefill-tps", "disaggregation.prefill_tokens_per_s", float, "disaggregated: prefill roof, tok/s"),
    ("--disagg-ttft-p95-s", "disaggregation.ttft_p95_s", float, "disaggregated: TTFT p95 SLO, s"),
    (
        "--prefill-chunk-tokens",
        "disaggregation.prefill_chunk_tokens",
        int,
        "disaggregated: prefill tokens per step",
    ),
)


def _dest(flag: str) -> str:
    return "plan_" + flag.lstrip("-").replace("-", "_")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and one override flag per main input (what `inputs_from_args` reads)."""
    parser.add_argument(
        "--config",
        dest="plan_config",
        type=Path,
        metavar="FILE",
        help=f"planner input YAML (default: the bundled worked example, capacity/{WORKED_EXAMPLE})",
    )
    group = parser.add_argument_group("overrides (each replaces one key of the input file)")
    for flag, key, kind, text in _OVERRIDES:
        group.add_argument(flag, dest=_dest(flag), type=kind, metavar="N", help=f"{text} [{key}]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the planner's flags: `--config FILE`, `--json`, and one override per main input."""
    add_input_arguments(parser)
    parser.add_argument("--json", dest="plan_json", action="store_true", help="print JSON instead of a table")


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    values: dict[str, object] = {}
    for flag, key, _, _ in _OVERRIDES:
        value = getattr(args, _dest(flag), None)
        if value is not None:
            values[key] = value
    return values


def source_of(args: argparse.Namespace) -> str:
    """The input file as the reports name it: the `--config` path, or the bundled worked example."""
    config: Path | None = getattr(args, "plan_config", None)
    return str(config) if config is not None else f"capacity/{WORKED_EXAMPLE} (bundled)"


def inputs_from_args(args: argparse.Namespace) -> PlanInputs:
    """The inputs of `--config` (or the worked example) with the override flags applied; `InputError`."""
    return load_inputs(getattr(args, "plan_config", None), _overrides(args))


def error_text(exc: InputError, args: argparse.Namespace) -> str:
    """`error: key (from --flag): message`, naming the flag when the value came from one."""
    overrides = _overrides(args)
    flags = [flag for flag, key, _, _ in _OVERRIDES if key == exc.key and key in overrides]
    where = f" (from {flags[0]})" if flags else ""
    return f"error: {exc.key}{where}: {exc.message}"


def run(args: argparse.Namespace) -> int:
    """Plan from the parsed flags; print the table (or JSON with `--json`) and return the exit status."""
    source = source_of(args)
    try:
        inputs = inputs_from_args(args)
        plan = build_plan(inputs)
        disagg = None
        if inputs.disaggregation is not None:
            disagg = build_disagg_plan(inputs, plan.replicas.n_base)
    except InputError as exc:
        print(error_text(exc, args), file=sys.stderr)
        return EXIT_INPUT_ERROR
    if getattr(args, "plan_json", False):
        text = render_json(inputs, plan, source)
        if disagg is not None:
            document = json.loads(text) | {"disaggregated": disagg_document(disagg)}
            text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        sys.stdout.write(text)
    else:
        sys.stdout.write(render_table(inputs, plan, source))
        if disagg is not None:
            sys.stdout.write(render_disagg_table(inputs, disagg))
    return EXIT_OK
