"""Offline capacity planner: how many GPUs a pool needs, and why (DESIGN.md §7, issue 8).

Pure functions with the formulas in their docstrings — `memory` (KV bytes, KV budget), `batch`
(B_max from the SLO and a measured throughput table), `barriers` (Little's law, the three barriers,
headroom), `queueing` (utilisation, M/M/1, Erlang C), `spike` (cold-start backlog), `cost` — composed
by `plan.build_plan`, fed by `loader` (YAML) and shown by `report`; `cli` backs `llm-gateway plan`.
A disaggregated pool: `disagg` sizes both sets from the latency models `disagg_latency` composes
(`decode_step`, `decode_queue`, `prefill_queue`, `prefill_batching`); `disagg_report` prints it.
Stdlib plus PyYAML for the input file; no I/O outside `loader` and `cli`.
"""

from capacity.barriers import Barrier
from capacity.batch import SloTerm
from capacity.errors import CapacityError, InfeasibleError, InputError
from capacity.inputs import PlanInputs
from capacity.loader import load_inputs, parse_inputs
from capacity.plan import build_plan
from capacity.results import Plan

__all__ = [
    "Barrier",
    "CapacityError",
    "InfeasibleError",
    "InputError",
    "Plan",
    "PlanInputs",
    "SloTerm",
    "build_plan",
    "load_inputs",
    "parse_inputs",
]
