"""`bench plan-check`: does `llm-gateway plan` predict what the mock engine does with its plan?

For each arrival rate: plan the disaggregated pool (`capacity.disagg`), run the plan's base split
(N_p,base prefill : N_d,base decode replicas) at that rate on the mock's physics core in simulated time
(`bench.disagg_sim`: no servers, a few seconds of CPU), and compare per-request TTFT and TPOT, mean and
p95, with the plan's predictions at that split:

    error = predicted / simulated − 1        over every seed's requests after the first 10 % (warm-up)

A figure passes when |error| ≤ the tolerance (default 0.10). The simulation runs the profile the plan
describes: its KV bytes per token, prefill rate and chunk must equal the plan's (`ValueError` otherwise);
the link is the plan's. Exit status: 0 when every figure passes, 1 when one does not, 2 on bad input.

    llm-gateway bench plan-check --config capacity/examples/disaggregated.yaml --input-tokens 8192 \\
        --output-tokens 256 --tpot-max-ms 30 --disagg-ttft-p95-s 2 --rates 2 3 4
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from bench.disagg_sim import DisaggLoad, PoolShape, RequestTiming, simulate_disagg
from bench.stats import percentile
from capacity import cli as plan_cli
from capacity.disagg import DisaggPlan, build_disagg_plan
from capacity.errors import InputError
from capacity.inputs import PlanInputs
from mock_engine.physics import load_profile
from mock_engine.physics.kv_link import KvLink
from mock_engine.physics.profile import EngineProfile

DEFAULT_TOLERANCE_RATIO = 0.10
WARMUP_RATIO = 0.10
FIGURES = ("ttft_mean_s", "ttft_p95_s", "tpot_mean_s", "tpot_p95_s")


@dataclass(frozen=True, slots=True)
class Figures:
    """TTFT and TPOT, mean and p95, in seconds."""

    ttft_mean_s: float
    ttft_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float


@dataclass(frozen=True, slots=True)
class PlanCheck:
    """One rate: the plan's split, its predictions, the simulation's figures and the request count."""

    arrival_rate_per_s: float
    prefill_replicas: int
    decode_replicas: int
    predicted: Figures
    simulated: Figures
    requests: int

    def errors(self) -> dict[str, float]:
        """predicted / simulated − 1 per figure."""
        return {name: getattr(self.predicted, name) / getattr(self.simulated, name) - 1 for name in FIGURES}

    def passes(self, tolerance_ratio: float = DEFAULT_TOLERANCE_RATIO) -> bool:
        return all(abs(error) <= tolerance_ratio for error in self.errors().values())


def check_profile(inputs: PlanInputs, profile: EngineProfile) -> None:
    """`ValueError` when the profile is not the hardware the plan describes (kv_tok, R_p, chunk)."""
    disagg, model = inputs.disaggregation, inputs.model
    if disagg is None:
        raise ValueError("the plan input has no disaggregation section")
    kv_tok = 2 * model.n_layers * model.n_kv_heads * model.head_dim * model.kv_bytes_per_element
    pairs = (
        ("KV bytes per token", kv_tok, profile.kv_bytes_per_token),
        ("prefill tokens/s", disagg.prefill_tokens_per_s, profile.prefill.tokens_per_s),
        ("prefill chunk tokens", disagg.prefill_chunk_tokens, profile.prefill.chunk_tokens_per_step),
    )
    for what, planned, simulated in pairs:
        if planned != simulated:
            raise ValueError(f"{what}: the plan says {planned}, profile {profile.name!r} {simulated}")


def simulated_figures(timings: Sequence[RequestTiming]) -> Figures:
    """Mean and p95 (linear interpolation) of TTFT and TPOT."""
    ttft = [t.ttft_s for t in timings]
    tpot = [t.tpot_s for t in timings if t.tpot_s is not None]
    return Figures(sum(ttft) / len(ttft), percentile(ttft, 95), sum(tpot) / len(tpot), percentile(tpot, 95))


def check_rate(
    inputs: PlanInputs, profile: EngineProfile, *, requests: int, seeds: Sequence[int]
) -> PlanCheck:
    """Plan at the input's rate, simulate the base split with every seed, compare (module docstring)."""
    check_profile(inputs, profile)
    disagg, workload = inputs.disaggregation, inputs.workload
    assert disagg is not None
    plan: DisaggPlan = build_disagg_plan(inputs)
    shape = PoolShape(plan.prefill.n_base, plan.decode.n_base)
    link = KvLink("plan", disagg.link_bytes_per_s, disagg.link_latency_s)
    kept: list[RequestTiming] = []
    for seed in seeds:
        load = DisaggLoad(
            workload.arrival_rate_per_s,
            round(workload.mean_input_tokens),
            round(workload.mean_output_tokens),
            requests,
            seed,
        )
        kept.extend(simulate_disagg(profile, link, shape, load)[math.ceil(requests * WARMUP_RATIO) :])
    p = plan.predicted_at_base
    return PlanCheck(
        workload.arrival_rate_per_s,
        shape.prefill_replicas,
        shape.decode_replicas,
        Figures(p.ttft_mean_s, p.ttft_p95_s, p.tpot_mean_s, p.tpot_p95_s),
        simulated_figures(kept),
        len(kept),
    )


def render(checks: Sequence[PlanCheck], source: str, profile: str, tolerance_ratio: float) -> str:
    """A Markdown table: per rate and figure, predicted / simulated ms and the error."""
    header = "| λ req/s | P:D | requests | " + " | ".join(
        f"{name.removesuffix('_s').replace('_', ' ')} ms plan / sim (err)" for name in FIGURES
    )
    lines = [
        f"Planner accuracy: {source}, simulated on profile {profile}; tolerance ±{tolerance_ratio:.0%}",
        "",
        header + " | pass |",
        "|---" * (len(FIGURES) + 4) + "|",
    ]
    for check in checks:
        errors = check.errors()
        cells = [
            f"{getattr(check.predicted, n) * 1000:.1f} / {getattr(check.simulated, n) * 1000:.1f} "
            f"({errors[n]:+.1%})"
            for n in FIGURES
        ]
        verdict = "yes" if check.passes(tolerance_ratio) else "NO"
        lines.append(
            f"| {check.arrival_rate_per_s:g} | {check.prefill_replicas}:{check.decode_replicas} | "
            f"{check.requests} | " + " | ".join(cells) + f" | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan_cli.add_input_arguments(parser)
    parser.add_argument(
        "--rates", type=float, nargs="+", help="arrival rates to check (default: the input's)"
    )
    parser.add_argument("--requests", type=int, default=4000, help="requests per seed (default 4000)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 1..K, samples pooled (default 3)")
    parser.add_argument(
        "--profile", default="h100-13b-fp16", help="mock engine profile (default h100-13b-fp16)"
    )
    parser.add_argument(
        "--tolerance", type=float, default=DEFAULT_TOLERANCE_RATIO, help="pass when |error| ≤ this (0.10)"
    )


def run(args: argparse.Namespace) -> int:
    """Check every rate; print the table; 0 when all pass, 1 when one does not, 2 on bad input."""
    if args.requests < 10 or args.seeds < 1:
        raise ValueError("--requests must be ≥ 10 and --seeds ≥ 1")
    try:
        inputs = plan_cli.inputs_from_args(args)
        profile = load_profile(args.profile)
        rates = args.rates or [inputs.workload.arrival_rate_per_s]
        checks = [
            check_rate(
                dataclasses.replace(
                    inputs, workload=dataclasses.replace(inputs.workload, arrival_rate_per_s=rate)
                ),
                profile,
                requests=args.requests,
                seeds=range(1, args.seeds + 1),
            )
            for rate in rates
        ]
    except InputError as exc:
        print(plan_cli.error_text(exc, args), file=sys.stderr)
        return 2
    sys.stdout.write(render(checks, plan_cli.source_of(args), profile.name, args.tolerance))
    return 0 if all(check.passes(args.tolerance) for check in checks) else 1
