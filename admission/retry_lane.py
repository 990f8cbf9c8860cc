"""The retry lane: a refusal at arrival books its retry a place, and a retry that comes back when its
Retry-After said is admitted ahead of the fresh arrivals of its class.

Why: past the knee the gateway refuses at arrival with a Retry-After. Without the lane a client that
waits as told and comes back is one more arrival, admitted at the odds of a fresh one (about C / F of
arrivals at an offered rate F over a capacity C, fewer with the retries' own load): the Retry-After was
an estimate the client pays for with a second refusal. With the lane it is a booking:

- **promise** (a refusal at arrival of class k, for a request with a retry key): the lane's schedule
  moves on by one place, at `share` of the dispatch rate r_k left to class k
  (`PoolRates.available_per_s`), so at most that share of the class's dispatches is promised, and no
  sooner than `release_s`, when the held requests are forecast to have freed the slots that the places
  booked so far and this one need, the slots held above the caps first (the controller gives it from
  `ReleaseForecast.time_until_releases_s`; without a forecast, the pace alone): a place inside a
  cohort's hold would be refused again. (Giving no place at all without a forecast kept fewer retries:
  docs/bench-log/2026-12-05-retry-lane.md.)

      start_s     = max(next_free_s, now + max(1, release_s))
      retry_after = ceil(start_s − now)            (whole seconds, the header's unit)
      due_s       = now + retry_after              (when an SDK honouring it comes back)
      next_free_s = start_s + 1 / (share × r_k)

  No promise — the refusal keeps the queue's own Retry-After, and its retry will be a fresh arrival —
  when `retry_after` would pass `horizon_s` (the lane is booked that far, or the slots free later: a
  retry told to wait longer has missed its TTFT objective), when r_k is not measured yet, or when
  `share` is 0 (off).
- **claim** (an arrival whose key holds a promise, from `due_s − EARLY_S` until `due_s + GRACE_S`): the
  promise is used up and the arrival is *returning*: the controller probes for a free slot for it
  unless the classes above or returning requests wait, queues it at the head of its class (after the
  returning requests already there: `PriorityQueue.push(first=True)`), and early refusal counts only
  what is ahead of it there. A retry that comes earlier is a fresh arrival and keeps its promise; one
  that comes later finds the promise lapsed.

Promises are kept in issue order, which is due order (`next_free_s` never moves back), so lapsed ones
leave from the front; a key refused again while it holds a promise is promised anew (the old place
lapses); at most `MAX_PROMISES` are kept (the oldest go first).

What no order can do: in a sustained overload where every refused client retries once, the retries
are part of the offered load, so with a capacity C and F fresh arrivals per second at most C / F of the
retries can be admitted (all C admissions retries, F − C + C of them sent): two thirds at 1.5× the knee.
The lane gives its share of the capacity to returning requests; what it promises, it keeps.

Keys are the caller's (the gateway hashes tenant, model, prompt and output budget) and this process's:
behind several instances or workers a retry claims its promise only where it was refused.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

DEFAULT_SHARE = 1.0
"""The gateway's default share: returning retries may take all of their class's dispatches for the
next `DEFAULT_HORIZON_S` (measured against 0.5 and no lane: docs/bench-log/2026-12-05-retry-lane.md)."""
DEFAULT_HORIZON_S = 2.0
"""Booked places reach at most this far (seconds): a retry told to wait longer misses any TTFT objective
it had, and places further out cost fresh arrivals that can still meet theirs (a 10 s horizon did)."""
EARLY_S = 0.5
"""A retry this much before its due time still claims it (clock rounding, a client's timer firing early)."""
GRACE_S = 5.0
"""A promise lapses this long after its due time (the client has gone elsewhere)."""
MAX_PROMISES = 100_000


@dataclass(frozen=True, slots=True)
class RetryLaneStats:
    """Counts since start: promises made, claimed by a returning retry, lapsed unclaimed, and refusals
    that got none (the lane booked to its horizon, or no rate measured)."""

    promised: int
    claimed: int
    lapsed: int
    unpromised: int


class RetryLane:
    """One pool's retry lane (module docstring). Pure: time is passed in."""

    def __init__(self, share: float = DEFAULT_SHARE, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        if not 0 <= share <= 1:
            raise ValueError(f"share must be in [0, 1] (got {share})")
        if horizon_s < 1:
            raise ValueError(f"horizon_s must be ≥ 1 (got {horizon_s})")
        self._share = share
        self._horizon_s = horizon_s
        self._due_s: OrderedDict[Hashable, float] = OrderedDict()
        self._next_free_s = -math.inf
        self._promised = self._claimed = self._lapsed = self._unpromised = 0

    def __len__(self) -> int:
        """Promises outstanding (not claimed, not yet lapsed)."""
        return len(self._due_s)

    @property
    def share(self) -> float:
        """The share of a class's dispatch rate the lane books (0: off)."""
        return self._share

    @property
    def stats(self) -> RetryLaneStats:
        """The lane's counts since start."""
        return RetryLaneStats(self._promised, self._claimed, self._lapsed, self._unpromised)

    def promise(
        self, key: Hashable, now_s: float, rate_per_s: float | None, not_before_s: float | None = None
    ) -> int | None:
        """Book `key`'s retry; returns its Retry-After in whole seconds, None when no place is given
        (module docstring). `rate_per_s`: the dispatch rate left to the request's class;
        `not_before_s`: no place sooner than this many seconds from now (when the slots it needs are
        forecast to free; infinite: none will be)."""
        self._lapse(now_s)
        no_release = not_before_s is not None and not math.isfinite(not_before_s)
        if self._share <= 0 or no_release or rate_per_s is None or not 0 < rate_per_s < math.inf:
            self._unpromised += 1
            return None
        start_s = max(self._next_free_s, now_s + max(1.0, not_before_s or 0.0))
        retry_after_s = math.ceil(start_s - now_s - 1e-9)
        if retry_after_s > self._horizon_s:
            self._unpromised += 1
            return None
        self._next_free_s = start_s + 1.0 / (self._share * rate_per_s)
        self._due_s.pop(key, None)
        self._due_s[key] = now_s + retry_after_s
        if len(self._due_s) > MAX_PROMISES:
            self._due_s.popitem(last=False)
            self._lapsed += 1
        self._promised += 1
        return retry_after_s

    def claim(self, key: Hashable, now_s: float) -> bool:
        """True (the promise used up) when `key` comes back within its promise's window."""
        if not self._due_s:
            return False
        self._lapse(now_s)
        due_s = self._due_s.get(key)
        if due_s is None or now_s < due_s - EARLY_S:
            return False
        del self._due_s[key]
        self._claimed += 1
        return True

    def _lapse(self, now_s: float) -> None:
        due = self._due_s
        while due:
            key, due_s = next(iter(due.items()))
            if now_s <= due_s + GRACE_S:
                return
            del due[key]
            self._lapsed += 1
