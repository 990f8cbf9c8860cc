"""A pure priority queue for admission: classes, age limits, depth limits, displacement, fair share.

No asyncio inside and time comes from an injected `Clock`; the gateway's controller owns the waiting
(futures, timers) and calls in here when something happens, never polling:

- on arrival: `push(...)` → accepted (maybe displacing someone, who must be answered 429 `queue_full`)
  or refused (429 `queue_full`);
- on a client disconnect: `remove(entry)` (O(1));
- on the timer set to `next_expiry_s()`: `expire()` → entries to answer 429 `queue_timeout`;
- on a released slot: `pop_next()` → the entry to dispatch (already-expired entries are never
  returned: they stay queued until `expire()` collects them, so nobody's abandoned work is dispatched);
  `peek_next()` shows that entry without removing it (ask a replica first, then pop);
  `in_dispatch_order()` walks every waiter in that order and `take(entry)` dispatches any of them
  (a dispatcher that passes over waiters holding out for a specific replica: `admission.holds`);

Rules:
- Classes are ordered highest priority first (default `critical > interactive > batch`, max waits
  30 s / 10 s / 300 s as in DESIGN §4's example config). Each has `max_wait_s` and an optional
  `max_depth`; the queue has a global `max_depth` (default 2000).
- An entry's deadline is `enqueued_at_s + max_wait_s` of its class; it is expired when `now ≥ deadline`
  (so a timer set to `next_expiry_s()` always finds something to expire).
- Class at its own `max_depth` → refused (displacing a lower class would not make room in this one).
- Global depth reached → the arrival displaces the *youngest* waiter (the one that has waited least) of
  the *lowest* non-empty class strictly below its own; if no such class exists (equal or lower priority
  everywhere) it is refused.
- Dispatch order: highest non-empty class first; within a class, weighted fair queuing across tenants on
  estimated tokens (`admission.fair_share`), which is FIFO when a single tenant is queued. An entry
  pushed `first` (a retry returning when its Retry-After said: `admission.retry_lane`) goes ahead of
  the class's other waiters, after those pushed first before it.

Expired entries still count toward depth until `expire()` collects them; the controller's expiry timer
keeps that window short. The classes themselves, their defaults and their rules: `admission.priority_classes`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from admission.fair_share import FairShareQueue
from admission.outcomes import RejectReason
from admission.priority_classes import (
    DEFAULT_MAX_QUEUE_DEPTH,
    DEFAULT_PRIORITY_CLASSES,
    PriorityClass,
    validate_classes,
)
from admission.queue_entry import PushResult, QueueEntry
from core.clock import Clock

T = TypeVar("T")


@dataclass(slots=True)
class _Lane(Generic[T]):
    spec: PriorityClass
    rank: int
    fifo: OrderedDict[int, QueueEntry[T]] = field(default_factory=OrderedDict)
    fair: FairShareQueue = field(default_factory=FairShareQueue)


class PriorityQueue(Generic[T]):
    """Priority classes with age and depth limits, displacement, and fair share within a class."""

    def __init__(
        self,
        clock: Clock,
        classes: Sequence[PriorityClass] = DEFAULT_PRIORITY_CLASSES,
        max_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
    ) -> None:
        validate_classes(classes, max_depth)
        self._clock = clock
        self._max_depth = max_depth
        self._lanes: list[_Lane[T]] = [_Lane(spec=spec, rank=i) for i, spec in enumerate(classes)]
        self._by_name = {lane.spec.name: lane for lane in self._lanes}
        self._size = 0
        self._next_seq = 0

    def __len__(self) -> int:
        return self._size

    @property
    def max_depth(self) -> int:
        """The global depth limit."""
        return self._max_depth

    @property
    def class_names(self) -> tuple[str, ...]:
        """Class names, highest priority first."""
        return tuple(lane.spec.name for lane in self._lanes)

    def priority_class(self, priority: str) -> PriorityClass:
        """The configuration of class `priority` (ValueError when unknown)."""
        return self._lane(priority).spec

    def depth(self, priority: str) -> int:
        """Entries queued in class `priority` (the `queue_depth{priority}` gauge)."""
        return len(self._lane(priority).fifo)

    def depths(self) -> dict[str, int]:
        """Depth of every class, highest priority first."""
        return {lane.spec.name: len(lane.fifo) for lane in self._lanes}

    def ahead_of(self, priority: str) -> int:
        """Entries that would be dispatched before a new arrival of `priority` (its class and above)."""
        rank = self._lane(priority).rank
        return sum(len(lane.fifo) for lane in self._lanes[: rank + 1])

    def ahead_of_arrival(
        self, priority: str, tenant: str, estimated_tokens: int, weight: float = 1.0, *, first: bool = False
    ) -> int:
        """Entries that a new arrival of `tenant` in class `priority` would be dispatched after: every
        entry of the classes above, and those of its own class that fair share puts first — a tenant
        far past its share queues behind most of its class, a light one behind a request or so of each
        backlogged tenant (`FairShareQueue.ahead_of_arrival`); with `first` (a returning retry:
        `admission.retry_lane`), only those of its class queued first as well."""
        lane = self._lane(priority)
        above = sum(len(higher.fifo) for higher in self._lanes[: lane.rank])
        return above + lane.fair.ahead_of_arrival(tenant, float(estimated_tokens), weight, first=first)

    def drain_bound_s(self, priority: str) -> float:
        """Upper bound on the time until everything now queued at or above `priority` has left the
        queue (dispatched or timed out): the latest deadline among them minus now, ≥ 0."""
        rank = self._lane(priority).rank
        deadlines = [
            next(reversed(lane.fifo.values())).deadline_s for lane in self._lanes[: rank + 1] if lane.fifo
        ]
        return max(0.0, max(deadlines, default=0.0) - self._clock.now_s())

    def push(
        self,
        item: T,
        priority: str,
        tenant: str = "",
        estimated_tokens: int = 0,
        weight: float = 1.0,
        *,
        first: bool = False,
    ) -> PushResult[T]:
        """Queue `item` in class `priority` for `tenant` (fair-share cost `estimated_tokens / weight`);
        `first`: ahead of the class's other waiters (after those queued first before it:
        `FairShareQueue.push`).

        Refuses (`reason=QUEUE_FULL`) when the class is at its own depth cap, or when the queue is at
        its global cap and no strictly lower class has a waiter to displace. ValueError for an unknown
        class (the gateway clamps priorities before calling), a weight ≤ 0 or negative tokens — raised
        before anything is displaced.
        """
        lane = self._lane(priority)
        if weight <= 0 or estimated_tokens < 0:
            raise ValueError(
                f"weight must be > 0 and estimated_tokens ≥ 0 (got {weight}, {estimated_tokens})"
            )
        if lane.spec.max_depth is not None and len(lane.fifo) >= lane.spec.max_depth:
            return PushResult(entry=None, reason=RejectReason.QUEUE_FULL)
        displaced: QueueEntry[T] | None = None
        if self._size >= self._max_depth:
            victim_lane = self._lowest_nonempty_below(lane.rank)
            if victim_lane is None:
                return PushResult(entry=None, reason=RejectReason.QUEUE_FULL)
            displaced = next(reversed(victim_lane.fifo.values()))
            self._detach(victim_lane, displaced)
        now_s = self._clock.now_s()
        entry = QueueEntry(
            item=item,
            priority=priority,
            tenant=tenant,
            estimated_tokens=estimated_tokens,
            enqueued_at_s=now_s,
            deadline_s=now_s + lane.spec.max_wait_s,
            seq=self._next_seq,
        )
        self._next_seq += 1
        lane.fair.push(entry.seq, tenant, float(estimated_tokens), weight, first=first)
        lane.fifo[entry.seq] = entry
        self._size += 1
        return PushResult(entry=entry, displaced=displaced)

    def remove(self, entry: QueueEntry[T]) -> bool:
        """Take out a waiter whose client left. O(1). False when it is no longer queued."""
        lane = self._by_name.get(entry.priority)
        if lane is None or lane.fifo.get(entry.seq) is not entry:
            return False
        self._detach(lane, entry)
        return True

    def expire(self, now_s: float | None = None) -> list[QueueEntry[T]]:
        """Remove and return every entry with `now ≥ deadline` (answer them 429 `queue_timeout`).

        Deadlines are non-decreasing within a class, so this is O(classes + expired).
        """
        now = self._clock.now_s() if now_s is None else now_s
        expired: list[QueueEntry[T]] = []
        for lane in self._lanes:
            while lane.fifo:
                seq, entry = next(iter(lane.fifo.items()))
                if entry.deadline_s > now:
                    break
                del lane.fifo[seq]
                lane.fair.remove(seq)
                expired.append(entry)
        self._size -= len(expired)
        return expired

    def next_expiry_s(self) -> float | None:
        """The earliest deadline in the queue (clock time), or None when empty: one timer suffices."""
        heads = [next(iter(lane.fifo.values())).deadline_s for lane in self._lanes if lane.fifo]
        return min(heads, default=None)

    def pop_next(self) -> QueueEntry[T] | None:
        """Remove and return the next entry to dispatch, or None. Never returns an expired entry."""
        now_s = self._clock.now_s()
        for lane in self._lanes:
            while (seq := lane.fair.pop()) is not None:
                entry = lane.fifo[seq]
                if now_s >= entry.deadline_s:
                    continue  # left in `fifo` for expire() to answer with queue_timeout
                del lane.fifo[seq]
                self._size -= 1
                return entry
        return None

    def peek_next(self) -> QueueEntry[T] | None:
        """The entry `pop_next()` would return now, left queued, so a dispatcher can first ask whether
        a replica takes it and only then `pop_next()` (which also advances the fair-share clock).
        Expired entries are passed over exactly as `pop_next` passes over them."""
        now_s = self._clock.now_s()
        for lane in self._lanes:
            while (seq := lane.fair.peek()) is not None:
                entry = lane.fifo[seq]
                if now_s < entry.deadline_s:
                    return entry
                lane.fair.pop()  # out of the dispatch order; left in `fifo` for expire() to answer
        return None

    def in_dispatch_order(self) -> Iterator[QueueEntry[T]]:
        """The unexpired entries in the order `pop_next()` would return them (classes highest first,
        fair-share order within), lazily; entries removed or taken while iterating are skipped. For a
        dispatcher that may pass over some (`take` the one it dispatches)."""
        for lane in self._lanes:
            for seq in lane.fair.in_order():
                entry = lane.fifo.get(seq)
                if entry is not None and self._clock.now_s() < entry.deadline_s:
                    yield entry

    def take(self, entry: QueueEntry[T]) -> bool:
        """Remove `entry` for dispatch, as `pop_next()` would have (the fair-share clock advances to
        it); False when it is no longer queued."""
        lane = self._by_name.get(entry.priority)
        if lane is None or lane.fifo.get(entry.seq) is not entry:
            return False
        del lane.fifo[entry.seq]
        lane.fair.take(entry.seq)
        self._size -= 1
        return True

    def _lane(self, priority: str) -> _Lane[T]:
        lane = self._by_name.get(priority)
        if lane is None:
            raise ValueError(f"unknown priority class {priority!r}; known: {', '.join(self._by_name)}")
        return lane

    def _lowest_nonempty_below(self, rank: int) -> _Lane[T] | None:
        for lane in reversed(self._lanes[rank + 1 :]):
            if lane.fifo:
                return lane
        return None

    def _detach(self, lane: _Lane[T], entry: QueueEntry[T]) -> None:
        del lane.fifo[entry.seq]
        lane.fair.remove(entry.seq)
        self._size -= 1
