"""Queue waits bounded by the TTFT objective: a request that has waited most of its TTFT budget in the
gateway's queue can no longer meet it, so it is refused (429 with Retry-After) rather than served late.

For each class in `bound_classes` (default: every class but the lowest, which is what "may wait"
means: batch work is measured by throughput, not by TTFT):

    max_wait_s(class) = min(max_wait_s(class), queue_wait_ratio × ttft_slo_s)

The rest of admission is unchanged and uses the bounded wait everywhere: the queue answers
`queue_timeout` at that age, and early refusal (`AdmissionConfig.early_refusal_ratio`) refuses at arrival
what its forecast says would wait longer (`queue_full`, with the expected wait as Retry-After) — one
estimate for both. `queue_wait_ratio` (default 0.5) leaves the rest of the TTFT objective to the
replica's own queue and prefill; a finer, per-request budget (objective − predicted TTFT of the
replica it would go to) would break the queue's FIFO-within-class deadline order, and is not done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from admission.priority_classes import PriorityClass

DEFAULT_QUEUE_WAIT_RATIO = 0.5


def slo_bounded_classes(
    classes: Sequence[PriorityClass],
    ttft_slo_s: float | None,
    queue_wait_ratio: float | None,
    bound_classes: Sequence[str] | None = None,
) -> tuple[PriorityClass, ...]:
    """`classes` with the bound classes' `max_wait_s` capped (module docstring); unchanged when the
    pool has no TTFT objective or the ratio is None. An unknown name in `bound_classes` is a
    `ValueError` naming the known classes."""
    if ttft_slo_s is None or queue_wait_ratio is None:
        return tuple(classes)
    names = [c.name for c in classes]
    if bound_classes is None:
        bound = set(names[:-1])
    else:
        unknown = sorted(set(bound_classes) - set(names))
        if unknown:
            raise ValueError(f"slo.bound_classes: unknown class(es) {unknown}; known: {', '.join(names)}")
        bound = set(bound_classes)
    limit_s = queue_wait_ratio * ttft_slo_s
    return tuple(replace(c, max_wait_s=min(c.max_wait_s, limit_s)) if c.name in bound else c for c in classes)
