"""A pool's admission settings: its classes, queue depth, Retry-After ceiling and early refusal."""

from __future__ import annotations

from dataclasses import dataclass

from admission.priority_classes import DEFAULT_MAX_QUEUE_DEPTH, DEFAULT_PRIORITY_CLASSES, PriorityClass
from admission.retry_after import DEFAULT_MAX_RETRY_AFTER_S
from admission.retry_lane import DEFAULT_HORIZON_S


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """A pool's queue: classes (highest first, with max wait and optional own depth), the global
    depth (default 2000), the Retry-After ceiling (default 120 s), and early refusal.

    `early_refusal_ratio` (None: off): refuse an arrival at once with `queue_full` when it is not
    expected to be dispatched within that multiple of its class's `max_wait_s`, instead of queueing it
    only to answer `queue_timeout` after the full wait: a refusal that is certain anyway should be fast.

    An arrival of class k that found no free slot waits for `ahead_k` (the waiters now queued at or
    above k) plus the higher classes that keep arriving meanwhile (they overtake it). With B = ratio ×
    max_wait_s, λ_above the demand of the classes strictly above k (their arrivals, refused ones too),
    and m = 2 √(λ_above × B) a margin for a burst of them (Poisson; `OVERTAKE_MARGIN_SIGMAS`), it needs

        need = ahead_k + 1 + λ_above × B + m        slot releases within B

    and is queued only when both hold:

    1. capacity:  need ≤ C × B, with C = held tickets ÷ mean hold time (Little's law on this
                  controller's own tickets: the pool's dispatch capacity when it is full, which it is
                  when this runs). So the expected wait is (ahead_k + 1 + m) ÷ (C − λ_above); a class
                  that the classes above leave nothing (C ≤ λ_above) is refused at once, whatever its
                  own traffic, with its class's max wait as Retry-After (nothing sooner is known).
    2. forecast:  the tickets held now are expected to free `need` slots within B (`ReleaseForecast`:
                  each at its dispatch time + the mean hold time; this catches cohorts of
                  equal-length requests that free their slots together).

    Either check is overruled by evidence that k would be served: the classes below k were
    dispatched over the last seconds fast enough to give it `need` slots within B
    (`admission.early_refusal`, λ_below). The queue serves k first, so those slots were its; the
    forecast sees releases, not caps that grow (a cold onset), and refused the top class there while
    the classes below were served.

    The checks run only when the fast path found no free slot and there is evidence: not before a
    ticket has completed (no hold time), not while this controller holds no ticket, and not when
    `full_by_own_caps()` (given by the gateway) says the pool is blocked by a limit it shares with
    other pools (the process's upstream connection limit): then slots free up with work it cannot
    see, and the arrival queues. With `early_refusal_needs_queue` (set where shared slot credits
    govern the pool: Redis state and a configured `max_concurrency_per_replica`) an arrival that would
    be first in line always queues, because a queued request is what makes the credit refiller ask
    Redis for more. Retry-After of an early refusal is when a retry could be
    admitted: the expected wait for the capacity check, (time to the needed release − B) for the
    forecast, clamped like every Retry-After.
    """

    classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH
    max_retry_after_s: int = DEFAULT_MAX_RETRY_AFTER_S
    early_refusal_ratio: float | None = None
    early_refusal_needs_queue: bool = False
    retry_lane_share: float = 0.0
    """The share of a class's dispatch rate the retry lane books for returning retries
    (`admission.retry_lane`); 0 (this class's default): off. The gateway's default is
    `admission.retry_lane.DEFAULT_SHARE` (`gateway.config.admission_settings`)."""
    retry_lane_horizon_s: float = DEFAULT_HORIZON_S
    """How far ahead the retry lane books (seconds); a refusal past it keeps the queue's Retry-After."""
    lowest_class_reserve: float = 0.0
    """The share of a learned cap the lowest class leaves to the classes above while they have demand
    (`admission.lowest_class_reserve`); 0: none."""
