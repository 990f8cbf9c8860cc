"""Weighted fair queuing across tenants on estimated tokens (self-clocked fair queuing, SCFQ).

Within one priority class, waiting requests are ordered by a *virtual finish tag* instead of arrival
time, so a tenant flooding the queue with long requests cannot starve another tenant's short ones:

    start_tag  = max(V, last_finish[tenant])
    finish_tag = start_tag + max(cost_tokens, 1) / weight
    pop()      → the live key with the smallest (finish_tag, key); then V := its finish_tag

A key pushed `first` (a returning retry: `admission.retry_lane`) gets `finish_tag = V` instead, ahead of
every backlogged key (ties: key order, so FIFO among such keys); its tenant is still charged its cost
(`last_finish[tenant] = max(V, last_finish[tenant]) + cost / weight`), so the tenant's later keys pay
for it and fair share holds over time.

`V` is the virtual time (the finish tag of the last request dispatched). A tenant that was idle starts
at `V`, so idleness earns no credit; a tenant with weight 2 advances half as fast per token as one with
weight 1 and therefore gets about twice the tokens dispatched while both are backlogged. A newcomer's
request is ordered by its own small tag, so it waits behind about one request of each backlogged
tenant, not behind the whole flood. Ties (equal tags) fall back to the key order, which callers make
FIFO (a sequence number).

Removal is O(1) (lazy: the heap entry is skipped when popped; the heap is compacted when more than
half of it is stale). When a tenant has nothing left queued its `last_finish` is forgotten: after a pop
it equals `V` anyway, and after a removal the removed (never served) cost is forgiven. When the whole
structure empties, `V` resets to 0 so tags stay small.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

_MIN_COST_TOKENS = 1.0
_COMPACT_MIN_HEAP = 64


@dataclass(slots=True)
class _Tagged:
    tenant: str
    finish_tag: float


@dataclass(slots=True)
class _TenantState:
    last_finish_tag: float
    queued: int


class FairShareQueue:
    """WFQ ordering of integer keys (the caller keeps the payloads). Pure: no clock, no I/O."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, _Tagged] = {}
        self._tenants: dict[str, _TenantState] = {}
        self._virtual_time = 0.0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    @property
    def virtual_time(self) -> float:
        """V: the finish tag of the last key popped (0 when the structure last emptied)."""
        return self._virtual_time

    def tenant_queued(self, tenant: str) -> int:
        """How many keys of `tenant` are live."""
        state = self._tenants.get(tenant)
        return 0 if state is None else state.queued

    def ahead_of_arrival(
        self, tenant: str, cost_tokens: float, weight: float = 1.0, *, first: bool = False
    ) -> int:
        """How many live keys a new key of `tenant` (at `cost_tokens / weight`; `first` as in `push`)
        would be popped after: those with a smaller finish tag than its own would be (ties: every live
        key, being older). O(live keys)."""
        finish_tag = self._virtual_time if first else self._finish_tag(tenant, cost_tokens, weight)
        return sum(1 for tagged in self._live.values() if tagged.finish_tag <= finish_tag)

    def _finish_tag(self, tenant: str, cost_tokens: float, weight: float) -> float:
        state = self._tenants.get(tenant)
        start_tag = self._virtual_time if state is None else max(self._virtual_time, state.last_finish_tag)
        return start_tag + max(cost_tokens, _MIN_COST_TOKENS) / max(weight, 1e-12)

    def push(
        self, key: int, tenant: str, cost_tokens: float, weight: float = 1.0, *, first: bool = False
    ) -> float:
        """Queue `key` for `tenant` at `cost_tokens / weight` (`first`: at V, ahead of the backlog; the
        tenant charged all the same: module docstring); returns its finish tag.

        Raises ValueError for a non-positive weight, a negative cost or a key already live.
        """
        if weight <= 0:
            raise ValueError(f"tenant weight must be > 0 (got {weight})")
        if cost_tokens < 0:
            raise ValueError(f"cost_tokens must be ≥ 0 (got {cost_tokens})")
        if key in self._live:
            raise ValueError(f"key {key} is already queued")
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _TenantState(last_finish_tag=self._virtual_time, queued=0)
        start_tag = max(self._virtual_time, state.last_finish_tag)
        charged_tag = start_tag + max(cost_tokens, _MIN_COST_TOKENS) / weight
        state.last_finish_tag = charged_tag
        finish_tag = self._virtual_time if first else charged_tag
        state.queued += 1
        self._live[key] = _Tagged(tenant=tenant, finish_tag=finish_tag)
        heapq.heappush(self._heap, (finish_tag, key))
        return finish_tag

    def pop(self) -> int | None:
        """Remove and return the live key with the smallest finish tag, or None when empty."""
        while self._heap:
            finish_tag, key = heapq.heappop(self._heap)
            tagged = self._live.get(key)
            if tagged is None or tagged.finish_tag != finish_tag:
                continue
            self._virtual_time = finish_tag
            self._forget(key, tagged)
            return key
        return None

    def peek(self) -> int | None:
        """The key `pop()` would return, left in place (stale heap tops are discarded), or None."""
        while self._heap:
            finish_tag, key = self._heap[0]
            tagged = self._live.get(key)
            if tagged is not None and tagged.finish_tag == finish_tag:
                return key
            heapq.heappop(self._heap)
        return None

    def in_order(self) -> Iterator[int]:
        """The live keys in `pop()` order, lazily (a walk of a copy of the heap: k keys cost
        O(n + k log k), nothing is sorted up front); keys removed or taken meanwhile are skipped."""
        heap = list(self._heap)
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            (finish_tag, key), at = heapq.heappop(frontier)
            for child in (2 * at + 1, 2 * at + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
            tagged = self._live.get(key)
            if tagged is not None and tagged.finish_tag == finish_tag:
                yield key

    def take(self, key: int) -> bool:
        """Remove live `key` as if `pop()` had returned it, wherever it stands in the order: V becomes
        max(V, its finish tag), so keys passed over keep their (earlier) tags and stay ahead of
        newcomers. Returns False when it was not live."""
        tagged = self._live.get(key)
        if tagged is None:
            return False
        self._virtual_time = max(self._virtual_time, tagged.finish_tag)
        self._forget(key, tagged)
        self._maybe_compact()
        return True

    def remove(self, key: int) -> bool:
        """Drop a live key (its client left or it expired). Returns False when it was not live."""
        tagged = self._live.get(key)
        if tagged is None:
            return False
        self._forget(key, tagged)
        self._maybe_compact()
        return True

    def _forget(self, key: int, tagged: _Tagged) -> None:
        del self._live[key]
        state = self._tenants[tagged.tenant]
        state.queued -= 1
        if state.queued == 0:
            del self._tenants[tagged.tenant]
        if not self._live:
            self._heap.clear()
            self._virtual_time = 0.0

    def _maybe_compact(self) -> None:
        if len(self._heap) < _COMPACT_MIN_HEAP or len(self._heap) <= 2 * len(self._live):
            return
        self._heap = [(tagged.finish_tag, key) for key, tagged in self._live.items()]
        heapq.heapify(self._heap)
