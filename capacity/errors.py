"""The planner's exceptions: every input problem names the key that caused it.

`InputError` is raised by the loader for a missing, unknown, mistyped or out-of-range key, and by the
planner when the inputs are consistent on their own but cannot be planned together (for example an SLO
that no measured batch meets, or weights that do not fit in GPU memory). The key is a dotted path into
the YAML file (`workload.arrival_rate_per_s`, `throughput.points[2].batch`), so an operator can find
it; the CLI also names the flag when the value came from one.
"""

from __future__ import annotations


class CapacityError(Exception):
    """Base class of everything the capacity planner raises on purpose."""


class InputError(CapacityError):
    """An input key is missing, unknown, of the wrong type or out of range."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class InfeasibleError(InputError):
    """The inputs are valid one by one but no plan satisfies them (e.g. no batch meets the SLO)."""
