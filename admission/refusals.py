"""The queue's refusals and their Retry-After: early refusal at arrival, and the refusal of a waiter.

Early refusal (`AdmissionConfig.early_refusal_ratio`; the arithmetic is `admission.early_refusal`'s):
an arrival that found no free slot is refused at once (429 `queue_full`) when it is not expected to be
dispatched within its class's budget. The waiters counted ahead of it are those fair share would
dispatch first (`PriorityQueue.ahead_of_arrival`), so under overload the tenants past their share are
the ones refused and what is admitted keeps the shares. Slots held above the replicas' caps
(`slots_over_caps`, a learned cap cut below what runs) must be released before any waiter gets one.
It stays out when a limit shared with other pools is what blocks (`full_by_own_caps` False) and, with
`early_refusal_needs_queue`, for an arrival that would be first in line.

Retry-After of every queue refusal: `queue_retry_after_s(ahead, r, drain_bound)` — `ahead` = waiters at
or above the class, r = the dispatch rate left to the class (the pool's capacity C = held tickets ÷
mean hold time, minus the measured dispatch rate of the classes above), capped by the time by which
everything ahead has left the queue; clamped to [1, max_retry_after_s]. An early refusal's Retry-After
is its expected wait instead, when one is known.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from admission.config import AdmissionConfig
from admission.dispatch_rate import PoolRates
from admission.early_refusal import hopeless
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_queue import PriorityQueue
from admission.release_forecast import ReleaseForecast
from admission.retry_after import clamp_retry_after_s, queue_retry_after_s
from admission.ticket import AdmissionRequest


class Refusals:
    """One controller's refusals (module docstring)."""

    def __init__(
        self,
        config: AdmissionConfig,
        queue: PriorityQueue[Any],
        rates: PoolRates,
        forecast: ReleaseForecast,
        *,
        full_by_own_caps: Callable[[], bool] | None = None,
        slots_over_caps: Callable[[AdmissionRequest], int] | None = None,
    ) -> None:
        self._config = config
        self._queue = queue
        self._rates = rates
        self._forecast = forecast
        self._full_by_own_caps = full_by_own_caps
        self._slots_over_caps = slots_over_caps

    def raise_if_hopeless(self, request: AdmissionRequest, first: bool = False) -> None:
        """Early refusal of `request`, an arrival that found no free slot (module docstring; `first`:
        a returning retry, queued ahead of its class: `admission.retry_lane`)."""
        refusal = self.hopeless(request, first)
        if refusal is not None:
            raise refusal

    def hopeless(self, request: AdmissionRequest, first: bool = False) -> AdmissionRefused | None:
        """`raise_if_hopeless`'s verdict as the refusal to raise, None to queue it."""
        config = self._config
        if config.early_refusal_ratio is None:
            return None
        priority = request.priority
        ahead = self._queue.ahead_of_arrival(
            priority, request.tenant.name, request.estimated_tokens, request.weight, first=first
        )
        if config.early_refusal_needs_queue and ahead == 0:
            return None
        if self._full_by_own_caps is not None and not self._full_by_own_caps():
            return None  # blocked by a limit shared with other pools: their releases free slots too
        class_name = self._queue.priority_class(priority).name
        verdict = hopeless(
            priority=priority,
            ratio=config.early_refusal_ratio,
            max_wait_s=self._queue.priority_class(priority).max_wait_s,
            ahead=ahead,
            blocked=self.blocked(request),
            capacity_per_s=self._rates.capacity_per_s(),
            above_per_s=self._rates.above_per_s(class_name),
            forecast=self._forecast,
            below_per_s=self._rates.below_per_s(class_name),
        )
        return None if verdict is None else self.early(priority, verdict.why, verdict.wait_s)

    def blocked(self, request: AdmissionRequest) -> int:
        """Slots held above the replicas' caps as `request` sees them: releases that free nothing."""
        return 0 if self._slots_over_caps is None else self._slots_over_caps(request)

    def early(self, priority: str, why: str, wait_s: float | None) -> AdmissionRefused:
        """429 `queue_full` at arrival; Retry-After is `wait_s`, when a retry could be admitted (the
        queue's estimate when none is known)."""
        if wait_s is None:
            return self.queue(RejectReason.QUEUE_FULL, priority, why)
        retry_after_s = clamp_retry_after_s(wait_s, self._config.max_retry_after_s)
        return AdmissionRefused(RejectReason.QUEUE_FULL, retry_after_s, why, priority=priority)

    def queue(self, reason: RejectReason, priority: str, message: str) -> AdmissionRefused:
        """A queue refusal (`reason`) of class `priority`, with the queue's Retry-After."""
        class_name = self._queue.priority_class(priority).name
        retry_after_s = queue_retry_after_s(
            self._queue.ahead_of(priority),
            self._rates.available_per_s(class_name),
            self._queue.drain_bound_s(priority),
            self._config.max_retry_after_s,
        )
        return AdmissionRefused(reason, retry_after_s, message, priority=priority)
