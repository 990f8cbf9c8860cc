"""The controller's side of the retry lane (`admission.retry_lane`): who claims a place at arrival, and
what a queue refusal is booked, from the pool's rates and release forecast.

- `claim(request)`: an arrival whose retry key holds a place now is *returning* (reported `claimed`).
- `refused(request, refusal, returning=...)`: a returning request refused all the same is reported
  `broken`; a `queue_full` or `queue_timeout` refusal with a retry key is booked a place — at the
  dispatch rate left to its class (`PoolRates.available_per_s`), no sooner than the held requests are
  forecast to free the slots the places booked so far, this one and the slots held above the caps
  need (`ReleaseForecast.time_until_releases_s`, when it can tell) — and its
  Retry-After and message say so (`promised`), or it keeps the queue's Retry-After (`unpromised`).
  With `retry_lane_share` 0 nothing is booked or reported.
"""

from __future__ import annotations

from typing import Any

from admission.dispatch_rate import PoolRates
from admission.observer import AdmissionObserver
from admission.outcomes import AdmissionRefused, RejectReason
from admission.priority_queue import PriorityQueue
from admission.refusals import Refusals
from admission.release_forecast import ReleaseForecast
from admission.retry_lane import RetryLane
from admission.ticket import AdmissionRequest
from core.clock import Clock

BOOKED_REASONS = (RejectReason.QUEUE_FULL, RejectReason.QUEUE_TIMEOUT)


class RetryBooking:
    """One controller's retry lane and what it books it from (module docstring)."""

    def __init__(
        self,
        lane: RetryLane,
        *,
        clock: Clock,
        queue: PriorityQueue[Any],
        rates: PoolRates,
        forecast: ReleaseForecast,
        refusals: Refusals,
        observer: AdmissionObserver | None = None,
    ) -> None:
        self.lane = lane
        self._clock = clock
        self._queue = queue
        self._rates = rates
        self._forecast = forecast
        self._refusals = refusals
        self._observer = observer

    def claim(self, request: AdmissionRequest) -> bool:
        """True when `request` claims its place now: it is returning."""
        if not len(self.lane):
            return False
        key = request.retry_key
        claimed = key is not None and self.lane.claim(key, self._clock.now_s())
        if claimed:
            self._report("claimed", request)
        return claimed

    def refused(self, request: AdmissionRequest, refusal: AdmissionRefused, *, returning: bool) -> None:
        """`request` is refused with `refusal`: report a broken place, book a new one (module docstring)."""
        if returning:
            self._report("broken", request)
        key = request.retry_key
        if not self.lane.share or refusal.reason not in BOOKED_REASONS or key is None:
            return
        release_s = self._forecast.time_until_releases_s(len(self.lane) + 1 + self._refusals.blocked(request))
        class_name = self._queue.priority_class(request.priority).name
        retry_after_s = self.lane.promise(
            key,
            self._clock.now_s(),
            self._rates.available_per_s(class_name),
            release_s,
        )
        if retry_after_s is not None:
            refusal.retry_after_s = retry_after_s
            refusal.message += f"; a retry in {retry_after_s} s goes ahead of new arrivals"
        self._report("unpromised" if retry_after_s is None else "promised", request)

    def _report(self, outcome: str, request: AdmissionRequest) -> None:
        if self._observer is not None:
            self._observer.retry_lane(outcome, request.priority)
