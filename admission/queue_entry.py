"""A queued waiter (`QueueEntry`) and the outcome of queueing one (`PushResult`): the values
`admission.priority_queue` hands out and takes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from admission.outcomes import RejectReason

T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)
class QueueEntry(Generic[T]):
    """A waiter. `item` is the caller's payload (e.g. its future); identity is the entry itself."""

    item: T
    priority: str
    tenant: str
    estimated_tokens: int
    enqueued_at_s: float
    deadline_s: float
    seq: int

    def waited_s(self, now_s: float) -> float:
        """Time spent in the queue so far (the `queue_wait_seconds` metric and `x-gateway-queue-ms`)."""
        return max(0.0, now_s - self.enqueued_at_s)


@dataclass(frozen=True, slots=True)
class PushResult(Generic[T]):
    """Outcome of `push`: `entry` when queued; `displaced` is a waiter evicted to make room (answer it
    429 `queue_full`); `reason` is `QUEUE_FULL` when the arrival itself was refused."""

    entry: QueueEntry[T] | None
    displaced: QueueEntry[T] | None = None
    reason: RejectReason | None = None

    @property
    def accepted(self) -> bool:
        """True when the arrival is now waiting in the queue."""
        return self.entry is not None
