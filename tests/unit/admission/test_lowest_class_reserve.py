"""The lowest class's share of a learned cap (admission/lowest_class_reserve.py)."""

from __future__ import annotations

import pytest

from admission.lowest_class_reserve import MIN_DEMAND_PER_S, cap_share

CLASSES = ("critical", "interactive", "batch")


def test_the_lowest_class_leaves_the_reserve_while_a_class_above_has_demand() -> None:
    assert cap_share("batch", CLASSES, 0.1, above_demand_per_s=lambda: 5.0) == pytest.approx(0.9)


@pytest.mark.parametrize("priority", ["critical", "interactive"])
def test_every_other_class_fills_the_whole_cap(priority: str) -> None:
    assert cap_share(priority, CLASSES, 0.1, above_demand_per_s=lambda: 50.0) == 1.0


def test_without_demand_above_or_without_a_reserve_the_lowest_fills_the_whole_cap() -> None:
    """A pool serving only batch work loses nothing to a reservation nobody uses."""
    assert cap_share("batch", CLASSES, 0.1, above_demand_per_s=lambda: MIN_DEMAND_PER_S / 2) == 1.0
    assert cap_share("batch", CLASSES, 0.0, above_demand_per_s=lambda: 50.0) == 1.0
    assert cap_share("only", ("only",), 0.1, above_demand_per_s=lambda: 50.0) == 1.0
