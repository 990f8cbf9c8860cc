"""What the admission controller reports, without importing a metrics library.

The gateway passes an `AdmissionObserver` (usually a thin adapter onto its Prometheus objects):

| callback                               | when                        | metric (`llm_gateway_`)        |
|----------------------------------------|-----------------------------|--------------------------------|
| `queue_depth_changed(priority, depth)` | a class's depth changed     | `queue_depth{priority}`        |
| `dispatched(priority, queue_wait_s)`   | got a slot (0 s: fast path) | `queue_wait_seconds{priority}` |
| `rejected(reason, priority)`           | every refusal of `admit`    | `rejections_total{reason}`     |
| `held(outcome, held_s)`                | a hold began or ended       | `prefix_wait_total{outcome}`,  |
|                                        | (`admission.holds`)         | `prefix_wait_seconds{outcome}` |
| `retry_lane(outcome, priority)`        | a retry promised, claimed,  | `retry_lane_total{outcome}`    |
|                                        | or refused without one      |                                |

Callbacks run synchronously inside the controller's event handling: keep them O(1), never await, and
never raise (an exception would propagate into `admit` or `on_release`). The dispatch rate is read on
demand (`AdmissionController.dispatch_rate_per_s()`, e.g. from a callback gauge).

Every controller also keeps an `AdmissionStats` (plain counters, readable by tests and admin views).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from admission.outcomes import HoldOutcome, RejectReason


class AdmissionObserver(Protocol):
    """Receives admission events (see the module docstring for timing and metric mapping)."""

    def queue_depth_changed(self, priority: str, depth: int) -> None:
        """Class `priority` now has `depth` waiters."""
        ...

    def dispatched(self, priority: str, queue_wait_s: float) -> None:
        """A request of class `priority` left for a replica after waiting `queue_wait_s`."""
        ...

    def rejected(self, reason: RejectReason, priority: str) -> None:
        """A request of class `priority` was refused with `reason`."""
        ...

    def held(self, outcome: HoldOutcome, held_s: float) -> None:
        """A waiter began to hold (`HELD`, 0 s) or left the queue after holding, `held_s` seconds
        after its first hold (`HoldOutcome`)."""
        ...

    def retry_lane(self, outcome: str, priority: str) -> None:
        """A queue refusal of class `priority` booked its retry (`promised`) or got no place
        (`unpromised`), an arrival claimed its booking (`claimed`), or a returning one was refused all
        the same (`broken`): `admission.retry_lane`."""
        ...


@dataclass(slots=True)
class AdmissionStats:
    """Counters since the controller was built, by class (`rejected` by reason). `fast_path` counts
    dispatches that never queued; `cancelled` waiters whose caller left while queued; the mean wait of
    a class is `queue_wait_s_sum[c] / dispatched[c]`; `holds` the hold reports by outcome."""

    dispatched: Counter[str] = field(default_factory=Counter)
    fast_path: Counter[str] = field(default_factory=Counter)
    queue_wait_s_sum: dict[str, float] = field(default_factory=dict)
    rejected: Counter[RejectReason] = field(default_factory=Counter)
    cancelled: Counter[str] = field(default_factory=Counter)
    holds: Counter[HoldOutcome] = field(default_factory=Counter)

    def record_dispatch(self, priority: str, queue_wait_s: float, fast_path: bool) -> None:
        """Count one dispatch of class `priority`."""
        self.dispatched[priority] += 1
        self.queue_wait_s_sum[priority] = self.queue_wait_s_sum.get(priority, 0.0) + queue_wait_s
        if fast_path:
            self.fast_path[priority] += 1
