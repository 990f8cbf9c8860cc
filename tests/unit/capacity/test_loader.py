"""The input file: defaults, overrides, and errors that name the offending key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from capacity.errors import InfeasibleError, InputError
from capacity.loader import apply_overrides, load_inputs, parse_inputs, read_yaml, worked_example_text
from capacity.plan import build_plan

from .conftest import WORKED_EXAMPLE_PATH


@pytest.fixture
def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKED_EXAMPLE_PATH.read_text(encoding="utf-8"))
    return data


def _error(raw: dict[str, Any]) -> InputError:
    with pytest.raises(InputError) as info:
        build_plan(parse_inputs(raw))
    return info.value


def test_bundled_example_is_the_repository_file() -> None:
    assert worked_example_text() == WORKED_EXAMPLE_PATH.read_text(encoding="utf-8")
    assert load_inputs() == load_inputs(WORKED_EXAMPLE_PATH)


def test_units_are_converted(raw: dict[str, Any]) -> None:
    inputs = parse_inputs(raw)
    assert inputs.gpu.memory_bytes == 80e9
    assert inputs.gpu.bandwidth_bytes_per_s == 3.35e12
    assert inputs.slo.tpot_max_s == pytest.approx(0.0167)
    assert inputs.model.weight_bytes_per_parameter == 2  # defaults to bytes_per_element
    assert inputs.workload.context_tokens == 800


def test_optional_sections_default_to_the_design_values(raw: dict[str, Any]) -> None:
    for name in ("headroom", "spike", "cost"):
        del raw[name]
    inputs = parse_inputs(raw)
    assert (inputs.headroom.ratio, inputs.headroom.min_replicas) == (0.5, 1)
    assert (inputs.spike.factor, inputs.spike.cold_start_s, inputs.spike.target_utilisation_ratio) == (
        3,
        90,
        0.8,
    )
    assert (inputs.cost.compare_batch, inputs.cost.useful_load_ratio) == (None, 0.3)
    assert build_plan(inputs).cost.compare_batch == 16  # the smallest measured batch


def test_aggregate_defaults_to_batch_times_stream(raw: dict[str, Any]) -> None:
    del raw["throughput"]["points"][1]["aggregate_tokens_per_s"]
    assert parse_inputs(raw).throughput.at_batch(64).aggregate_tokens_per_s == 4_352


def test_numeric_strings_are_numbers(raw: dict[str, Any]) -> None:
    raw["model"]["parameters"] = "13e9"  # PyYAML reads 13e9 as a string
    assert parse_inputs(raw).model.parameters == 13e9


def test_overrides_replace_one_key_and_leave_the_source_alone(raw: dict[str, Any]) -> None:
    before = copy.deepcopy(raw)
    merged = apply_overrides(raw, {"workload.arrival_rate_per_s": 40, "headroom.ratio": 0.25})
    assert raw == before
    assert merged["workload"]["arrival_rate_per_s"] == 40
    assert merged["headroom"] == {"ratio": 0.25, "min_replicas": 1}
    plan = build_plan(parse_inputs(merged))
    assert plan.replicas.n_base == 3  # N_lat = 180/64 = 2.8
    assert plan.replicas.n_replicas == 4  # ceil(3 * 1.25)


@pytest.mark.parametrize(
    ("mutate", "key", "fragment"),
    [
        (lambda r: r.pop("workload"), "workload", "is required"),
        (lambda r: r["workload"].pop("arrival_rate_per_s"), "workload.arrival_rate_per_s", "is required"),
        (lambda r: r["workload"].update(arrival_rate_per_s=0), "workload.arrival_rate_per_s", "> 0"),
        (lambda r: r["workload"].update(arrival_rate_per_s="fast"), "workload.arrival_rate_per_s", "number"),
        (lambda r: r["workload"].update(arrival_rate_per_s=True), "workload.arrival_rate_per_s", "number"),
        (lambda r: r["workload"].update(arrival_rate=20), "workload.arrival_rate", "unknown key"),
        (lambda r: r.update(workloads={}), "workloads", "unknown section"),
        (lambda r: r.update(gpu=[80]), "gpu", "mapping"),
        (lambda r: r["model"].update(n_layers=40.5), "model.n_layers", "whole number"),
        (lambda r: r["gpu"].update(memory_gb=float("nan")), "gpu.memory_gb", "number"),
        (lambda r: r["throughput"].update(points=[]), "throughput.points", "non-empty list"),
        (lambda r: r["throughput"]["points"][2].pop("batch"), "throughput.points[2].batch", "is required"),
        (lambda r: r["throughput"]["points"][2].update(batch=64), "throughput.points[2].batch", "twice"),
        (lambda r: r["throughput"]["points"][0].update(tps=1), "throughput.points[0].tps", "unknown key"),
        (lambda r: r.update(slo={}), "slo", "at least one"),
        (lambda r: r["slo"].update(ttft_p95_s=1.0), "throughput.points[0].ttft_p95_s", "required"),
        (lambda r: r["spike"].update(target_utilisation_ratio=1.2), "spike.target_utilisation_ratio", "<= 1"),
        (lambda r: r["headroom"].update(ratio=-0.5), "headroom.ratio", ">= 0"),
        (lambda r: r["cost"].update(compare_batch=32), "cost.compare_batch", "not a measured row"),
    ],
)
def test_bad_input_names_the_key(mutate: Any, key: str, fragment: str, raw: dict[str, Any]) -> None:
    mutate(raw)
    error = _error(raw)
    assert error.key == key
    assert fragment in error.message
    assert str(error).startswith(f"{key}: ")


def test_slo_no_batch_can_meet_is_infeasible(raw: dict[str, Any]) -> None:
    raw["slo"] = {"tpot_max_ms": 5}
    error = _error(raw)
    assert isinstance(error, InfeasibleError)
    assert error.key == "slo"


def test_weights_that_do_not_fit_are_infeasible(raw: dict[str, Any]) -> None:
    raw["gpu"]["memory_gb"] = 24
    error = _error(raw)
    assert isinstance(error, InfeasibleError)
    assert error.key == "gpu.memory_gb"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("model: [unclosed", "not valid YAML"), ("- a\n- b\n", "mapping of sections")],
)
def test_unreadable_yaml_is_keyed_config(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment) as info:
        read_yaml(text, "x.yaml")
    assert info.value.key == "config"


def test_missing_file_is_keyed_config(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read") as info:
        load_inputs(tmp_path / "absent.yaml")
    assert info.value.key == "config"


def test_empty_file_reports_the_first_missing_section(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_inputs(path)
    assert info.value.key == "model"
