"""Shared fixtures: the design's worked example (DESIGN.md §7) as inputs and as a plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from capacity.inputs import PlanInputs
from capacity.loader import load_inputs
from capacity.plan import build_plan
from capacity.results import Plan

WORKED_EXAMPLE_PATH = Path(__file__).resolve().parents[3] / "capacity" / "examples" / "worked_example.yaml"


@pytest.fixture
def worked_inputs() -> PlanInputs:
    return load_inputs(WORKED_EXAMPLE_PATH)


@pytest.fixture
def worked_plan(worked_inputs: PlanInputs) -> Plan:
    return build_plan(worked_inputs)
