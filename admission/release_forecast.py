"""Forecast of replica-slot releases from the tickets held now: when will the next k slots free up?

The measured dispatch rate μ says how many slots free up per second *on average*. When requests are
alike in length it is a poor guide to the next few seconds: a burst of dispatches becomes a cohort that
finishes together about one service time later, so slots free up in waves with nothing in between, and
a waiter that arrives just after a wave waits a whole service time, whatever μ says. The controller's
early refusal therefore also asks this forecast, which knows when each held ticket was dispatched:

    ticket i (dispatched at d_i) is expected to release at d_i + S
    releases within h seconds  R(h) = #{i : d_i + S ≤ now + h}

where S is the mean hold time (dispatch → release) of completed tickets, an exponentially weighted mean
over completions (weight `DEFAULT_SMOOTHING` = 0.05 per completion: about the last 20 count). Before
the first completion S is a prior, when the dispatcher can give one: the held tickets' mean output
budget (`hold(output_tokens=…)`, tokens) × the time per token now (`seconds_per_token`, the engines'
own token latency). The first generation of a sudden overload lasts a whole hold time, and without a
prior nothing could be forecast — nor refused early — until its first request ended.
Tickets older than S count as releasing at once. Tickets dispatched later cannot release within h
when h < S; for h ≥ S the forecast cannot say (those would count too) and answers None, as it does
before the first completion.

Tickets are kept in dispatch order (the clock is monotonic), so "are at least k releases due within h"
is one look at the k-th oldest held ticket: O(k) in C, no sorting.

Each ticket may carry the key of the replica it was dispatched to (`hold(key)`); its hold time then
also feeds that key's own mean (`mean_hold_s_by_key`, `admission.hold_times`), which a wait for one
replica's next slot reads instead of S once the replica has enough holds. A retry that moves the
ticket to another replica still counts for the first one.

Limits: one S for every ticket assumes requests of broadly similar length. With a strongly mixed pool
(short embeddings beside long generations) the forecast is approximate in both directions: overdue long
requests count as releasing at once, and young short ones count as holding on for S. A per-request
estimate (e.g. from `max_tokens` and the measured time per token) would sharpen it. The controller only
consults it when no slot is free, and only to refuse; the rate estimate still applies on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice

from admission.hold_times import DEFAULT_MIN_SAMPLES, HoldTimesByKey
from core.clock import Clock

DEFAULT_SMOOTHING = 0.05


class ReleaseForecast:
    """Held tickets by dispatch time, and the mean hold time of completed ones (see the module doc)."""

    def __init__(
        self,
        clock: Clock,
        smoothing: float = DEFAULT_SMOOTHING,
        min_samples_per_key: int = DEFAULT_MIN_SAMPLES,
        seconds_per_token: Callable[[], float | None] | None = None,
    ) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1] (got {smoothing})")
        self._clock = clock
        self._smoothing = smoothing
        self._held: dict[int, tuple[float, str | None]] = {}  # ticket → (dispatched at, replica key)
        self._seconds_per_token = seconds_per_token
        self._budgets: dict[int, int] = {}  # ticket → output budget (tokens), until the first completion
        self._budget_sum = 0
        self._next_key = 0
        self._mean_hold_s: float | None = None
        self._by_key = HoldTimesByKey(smoothing, min_samples_per_key)

    def __len__(self) -> int:
        """Tickets held now."""
        return len(self._held)

    @property
    def mean_hold_s(self) -> float | None:
        """S: the smoothed hold time of completed tickets; before the first completion the prior (module
        docstring), None without one."""
        if self._mean_hold_s is None and self._budgets and self._seconds_per_token is not None:
            per_token_s = self._seconds_per_token()
            if per_token_s is not None:
                return per_token_s * self._budget_sum / len(self._budgets)
        return self._mean_hold_s

    @property
    def mean_hold_s_by_key(self) -> Mapping[str, float]:
        """Replica key → its own mean hold time, for keys with enough holds (`admission.hold_times`)."""
        return self._by_key

    def hold(self, replica_key: str | None = None, output_tokens: int | None = None) -> int:
        """A ticket was dispatched now (to `replica_key`, when known; with an output budget of
        `output_tokens`, when the request set one); returns its key for `release`."""
        key = self._next_key
        self._next_key += 1
        self._held[key] = (self._clock.now_s(), replica_key)
        if self._mean_hold_s is None and output_tokens:
            self._budgets[key] = output_tokens
            self._budget_sum += output_tokens
        return key

    def discard(self, key: int) -> None:
        """Forget ticket `key` without timing it (its slot was given back before anyone used it)."""
        self._held.pop(key, None)
        self._budget_sum -= self._budgets.pop(key, 0)

    def release(self, key: int) -> None:
        """The ticket `key` released its slot now (its hold time updates S, and its replica's mean).
        Unknown keys are ignored, so a double release cannot skew either."""
        held = self._held.pop(key, None)
        if held is None:
            return
        self._budgets.clear()  # measured from now on
        self._budget_sum = 0
        dispatched_at_s, replica_key = held
        hold_s = max(0.0, self._clock.now_s() - dispatched_at_s)
        if self._mean_hold_s is None:
            self._mean_hold_s = hold_s
        else:
            self._mean_hold_s += self._smoothing * (hold_s - self._mean_hold_s)
        if replica_key is not None:
            self._by_key.record(replica_key, hold_s)

    def time_until_releases_s(self, count: int) -> float | None:
        """Seconds until `count` held tickets are expected to have released (the k-th oldest's due
        time − now, ≥ 0); None without S or with fewer than `count` tickets held."""
        mean_hold_s = self.mean_hold_s
        if mean_hold_s is None or count <= 0:
            return None if mean_hold_s is None else 0.0
        kth_oldest = self._kth_oldest_dispatch_s(count)
        if kth_oldest is None:
            return None
        return max(0.0, kth_oldest + mean_hold_s - self._clock.now_s())

    def releases_due(self, count: int, within_s: float) -> bool | None:
        """Whether at least `count` held tickets are expected to release within `within_s` (R(h) ≥ k).

        None when the forecast cannot tell: no completion measured yet, or `within_s` ≥ S (tickets
        dispatched meanwhile would release too). `count` ≤ 0 is trivially True."""
        if count <= 0:
            return True
        mean_hold_s = self.mean_hold_s
        if mean_hold_s is None or within_s >= mean_hold_s:
            return None
        kth_oldest = self._kth_oldest_dispatch_s(count)
        if kth_oldest is None:
            return False
        return kth_oldest + mean_hold_s <= self._clock.now_s() + within_s

    def _kth_oldest_dispatch_s(self, count: int) -> float | None:
        """Dispatch time of the `count`-th oldest held ticket (count ≥ 1), None when fewer are held."""
        held = next(islice(iter(self._held.values()), count - 1, None), None)
        return None if held is None else held[0]
