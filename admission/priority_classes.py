"""Priority classes: what a class is (a name, a maximum queue wait, an optional depth of its own), the
default classes (`critical > interactive > batch`, 30 s / 10 s / 300 s, DESIGN §4's example config)
and queue depth (2000), and the rules a set of classes must follow. Apart from the queue
(`admission.priority_queue`) because the configuration, the SLO-bounded waits and the tenants' ceilings
read the classes without the queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX_QUEUE_DEPTH = 2000


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """One priority class: its name (a metric label), maximum queue age and optional own depth cap."""

    name: str
    max_wait_s: float
    max_depth: int | None = None


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("critical", max_wait_s=30.0),
    PriorityClass("interactive", max_wait_s=10.0),
    PriorityClass("batch", max_wait_s=300.0),
)


def validate_classes(classes: Sequence[PriorityClass], max_depth: int) -> None:
    """`ValueError` unless the classes are at least one, uniquely named, with positive waits and
    non-negative depths, and the queue's `max_depth` is at least 1."""
    if not classes:
        raise ValueError("at least one priority class is required")
    names = [spec.name for spec in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"priority class names must be unique: {names}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be ≥ 1 (got {max_depth})")
    for spec in classes:
        if spec.max_wait_s <= 0:
            raise ValueError(f"class {spec.name!r}: max_wait_s must be > 0 (got {spec.max_wait_s})")
        if spec.max_depth is not None and spec.max_depth < 0:
            raise ValueError(f"class {spec.name!r}: max_depth must be ≥ 0 (got {spec.max_depth})")
