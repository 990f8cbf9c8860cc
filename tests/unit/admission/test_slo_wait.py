"""Queue waits bounded by the TTFT objective (admission/slo_wait.py), and the pools built with them."""

from __future__ import annotations

import pytest

from admission.priority_classes import DEFAULT_PRIORITY_CLASSES
from admission.slo_wait import slo_bounded_classes


def waits(classes: tuple) -> dict[str, float]:
    return {c.name: c.max_wait_s for c in classes}


def test_every_class_but_the_lowest_waits_at_most_ratio_times_the_ttft_objective() -> None:
    bounded = slo_bounded_classes(DEFAULT_PRIORITY_CLASSES, 2.0, 0.5)
    assert waits(bounded) == {"critical": 1.0, "interactive": 1.0, "batch": 300.0}


def test_named_classes_and_a_wait_already_shorter_than_the_bound() -> None:
    bounded = slo_bounded_classes(DEFAULT_PRIORITY_CLASSES, 40.0, 0.5, ["critical", "interactive"])
    assert waits(bounded) == {"critical": 20.0, "interactive": 10.0, "batch": 300.0}


def test_off_without_a_ttft_objective_or_a_ratio() -> None:
    assert slo_bounded_classes(DEFAULT_PRIORITY_CLASSES, None, 0.5) == DEFAULT_PRIORITY_CLASSES
    assert slo_bounded_classes(DEFAULT_PRIORITY_CLASSES, 2.0, None) == DEFAULT_PRIORITY_CLASSES
    assert slo_bounded_classes(DEFAULT_PRIORITY_CLASSES, 2.0, 0.5, []) == DEFAULT_PRIORITY_CLASSES


def test_an_unknown_class_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown class\(es\) \['premium'\]"):
        slo_bounded_classes(DEFAULT_PRIORITY_CLASSES, 2.0, 0.5, ["premium"])
