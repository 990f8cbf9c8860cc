"""Read a plan's inputs from YAML (plus flag overrides); every error names the offending key.

File format (see `examples/worked_example.yaml`, the design's worked example): sections `model`,
`gpu`, `throughput`, `workload` and `slo` are required; `headroom`, `spike` and `cost` are optional
and default to the design's values (r = 0.5, min 1 replica; 3x spike, 90 s cold start, rho_target 0.8;
compare with the smallest measured batch, 30 % useful load). `disaggregation` (optional) adds the
two-pool plan (`capacity.disagg`; example `examples/disaggregated.yaml`). Memory is in GB = 10^9 bytes.
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from capacity.errors import InputError
from capacity.inputs import (
    GB_BYTES,
    CostInputs,
    DisaggInputs,
    GpuSpec,
    Headroom,
    ModelSpec,
    PlanInputs,
    Slo,
    Spike,
    ThroughputPoint,
    ThroughputTable,
    Workload,
)
from capacity.reader import Section

WORKED_EXAMPLE = "examples/worked_example.yaml"
"""The bundled worked example, relative to the `capacity` package."""

SECTIONS = ("model", "gpu", "throughput", "workload", "slo", "headroom", "spike", "cost", "disaggregation")
"""Top-level sections of the input file, in the order the worked example lists them."""


def worked_example_text() -> str:
    """The YAML text of the bundled worked example (DESIGN.md §7)."""
    return resources.files("capacity").joinpath(WORKED_EXAMPLE).read_text(encoding="utf-8")


def read_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse YAML text into the raw top-level mapping; errors are keyed `config`."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError("config", f"{source} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError("config", f"{source} must hold a mapping of sections, got {type(data).__name__}")
    return data


def read_file(path: Path) -> dict[str, Any]:
    """Read and parse a YAML file; a missing or unreadable file is an `InputError` keyed `config`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    return read_yaml(text, str(path))


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, object]) -> dict[str, Any]:
    """A copy of `raw` with each dotted `section.key` in `overrides` set (sections created as needed)."""
    merged = copy.deepcopy(dict(raw))
    for dotted, value in overrides.items():
        section_name, _, key = dotted.partition(".")
        section = merged.setdefault(section_name, {})
        if not isinstance(section, dict):
            raise InputError(section_name, "must be a mapping")
        section[key] = value
    return merged


def parse_inputs(raw: Mapping[str, Any]) -> PlanInputs:
    """Validate the raw mapping and build `PlanInputs`; `InputError` names the first bad key."""
    root = Section(raw, "")
    for name in raw:
        if name not in SECTIONS:
            raise InputError(str(name), f"unknown section (expected one of: {', '.join(SECTIONS)})")
    inputs = PlanInputs(
        model=_model(root.section("model")),
        gpu=_gpu(root.section("gpu")),
        throughput=_throughput(root.section("throughput")),
        workload=_workload(root.section("workload")),
        slo=_slo(root.section("slo")),
        headroom=_headroom(root.section("headroom", required=False)),
        spike=_spike(root.section("spike", required=False)),
        cost=_cost(root.section("cost", required=False)),
        disaggregation=_disaggregation(root.section("disaggregation")) if "disaggregation" in raw else None,
    )
    root.finish()
    _check_ttft_rows(inputs)
    return inputs


def load_inputs(path: Path | None = None, overrides: Mapping[str, object] | None = None) -> PlanInputs:
    """Inputs from `path` (default: the bundled worked example) with `overrides` applied."""
    raw = read_file(path) if path is not None else read_yaml(worked_example_text(), WORKED_EXAMPLE)
    return parse_inputs(apply_overrides(raw, overrides or {}))


def _model(s: Section) -> ModelSpec:
    kv_bytes = s.number("bytes_per_element", positive=True)
    spec = ModelSpec(
        name=s.string("name", default="model"),
        n_layers=s.integer("n_layers", minimum=1),
        n_kv_heads=s.integer("n_kv_heads", minimum=1),
        head_dim=s.integer("head_dim", minimum=1),
        parameters=s.number("parameters", positive=True),
        kv_bytes_per_element=kv_bytes,
        weight_bytes_per_parameter=s.number("weight_bytes_per_parameter", positive=True, default=kv_bytes),
    )
    s.finish()
    return spec


def _gpu(s: Section) -> GpuSpec:
    bandwidth_gb = s.optional_number("bandwidth_gb_per_s", positive=True)
    spec = GpuSpec(
        name=s.string("name", default="gpu"),
        memory_bytes=s.number("memory_gb", positive=True) * GB_BYTES,
        overhead_bytes=s.number("overhead_gb", minimum=0.0, default=0.0) * GB_BYTES,
        usd_per_hour=s.number("usd_per_hour", minimum=0.0),
        bandwidth_bytes_per_s=None if bandwidth_gb is None else bandwidth_gb * GB_BYTES,
    )
    s.finish()
    return spec


def _point(s: Section) -> ThroughputPoint:
    batch = s.integer("batch", minimum=1)
    stream = s.number("stream_tokens_per_s", positive=True)
    point = ThroughputPoint(
        batch=batch,
        stream_tokens_per_s=stream,
        aggregate_tokens_per_s=s.number("aggregate_tokens_per_s", positive=True, default=batch * stream),
        ttft_p95_s=s.optional_number("ttft_p95_s", minimum=0.0),
    )
    s.finish()
    return point


def _throughput(s: Section) -> ThroughputTable:
    rows = s.sections("points")
    points = [_point(row) for row in rows]
    seen: set[int] = set()
    for row, point in zip(rows, points, strict=True):
        if point.batch in seen:
            raise InputError(f"{row.path}.batch", f"batch {point.batch} is listed twice")
        seen.add(point.batch)
    table = ThroughputTable(
        points=tuple(points),
        ttft_mean_s=s.number("ttft_mean_s", minimum=0.0),
        context_tokens=s.optional_integer("context_tokens", minimum=1),
    )
    s.finish()
    return table


def _workload(s: Section) -> Workload:
    workload = Workload(
        arrival_rate_per_s=s.number("arrival_rate_per_s", positive=True),
        mean_input_tokens=s.number("mean_input_tokens", minimum=0.0),
        mean_output_tokens=s.number("mean_output_tokens", positive=True),
    )
    s.finish()
    return workload


def _slo(s: Section) -> Slo:
    tpot_ms = s.optional_number("tpot_max_ms", positive=True)
    slo = Slo(
        tpot_max_s=None if tpot_ms is None else tpot_ms / 1000.0,
        min_stream_tokens_per_s=s.optional_number("min_stream_tokens_per_s", positive=True),
        e2e_p95_s=s.optional_number("e2e_p95_s", positive=True),
        ttft_p95_s=s.optional_number("ttft_p95_s", positive=True),
    )
    s.finish()
    if all(
        value is None
        for value in (slo.tpot_max_s, slo.min_stream_tokens_per_s, slo.e2e_p95_s, slo.ttft_p95_s)
    ):
        raise InputError(
            s.path, "needs at least one of tpot_max_ms, min_stream_tokens_per_s, e2e_p95_s, ttft_p95_s"
        )
    return slo


def _headroom(s: Section) -> Headroom:
    headroom = Headroom(
        ratio=s.number("ratio", minimum=0.0, default=0.5),
        min_replicas=s.integer("min_replicas", minimum=1, default=1),
    )
    s.finish()
    return headroom


def _spike(s: Section) -> Spike:
    spike = Spike(
        factor=s.number("factor", minimum=1.0, default=3.0),
        cold_start_s=s.number("cold_start_s", minimum=0.0, default=90.0),
        target_utilisation_ratio=s.number(
            "target_utilisation_ratio", positive=True, maximum=1.0, default=0.8
        ),
    )
    s.finish()
    return spike


def _cost(s: Section) -> CostInputs:
    cost = CostInputs(
        compare_batch=s.optional_integer("compare_batch", minimum=1),
        useful_load_ratio=s.number("useful_load_ratio", positive=True, maximum=1.0, default=0.3),
    )
    s.finish()
    return cost


def _disaggregation(s: Section) -> DisaggInputs:
    """prefill_tokens_per_s, link_gb_per_s (GB = 10^9 B), ttft_p95_s; optional link_latency_ms,
    prefill_chunk_tokens (default 8,192) and ratio_table.{input_tokens, output_tokens} (lists of token
    counts)."""
    table = s.section("ratio_table", required=False)
    defaults = DisaggInputs(1.0, 1.0, 1.0)
    disagg = DisaggInputs(
        prefill_tokens_per_s=s.number("prefill_tokens_per_s", positive=True),
        link_bytes_per_s=s.number("link_gb_per_s", positive=True) * GB_BYTES,
        ttft_p95_s=s.number("ttft_p95_s", positive=True),
        link_latency_s=s.number("link_latency_ms", minimum=0.0, default=0.0) / 1000.0,
        prefill_chunk_tokens=s.integer(
            "prefill_chunk_tokens", minimum=1, default=defaults.prefill_chunk_tokens
        ),
        table_input_tokens=table.integers("input_tokens", default=defaults.table_input_tokens),
        table_output_tokens=table.integers("output_tokens", default=defaults.table_output_tokens),
    )
    table.finish()
    s.finish()
    return disagg


def _check_ttft_rows(inputs: PlanInputs) -> None:
    """A TTFT SLO needs a measured TTFT p95 on every row (indices in file order); a comparison batch
    must be a measured row."""
    points = inputs.throughput.points
    if inputs.slo.ttft_p95_s is not None:
        for index, point in enumerate(points):
            if point.ttft_p95_s is None:
                raise InputError(
                    f"throughput.points[{index}].ttft_p95_s",
                    "required on every row when slo.ttft_p95_s is set",
                )
    batch = inputs.cost.compare_batch
    if batch is not None and all(point.batch != batch for point in points):
        measured = ", ".join(str(point.batch) for point in points)
        raise InputError("cost.compare_batch", f"batch {batch} is not a measured row (measured: {measured})")
