"""Early refusal's arithmetic: is an arrival that found no free slot expected to be dispatched in time?

The rule and its inputs are `AdmissionConfig.early_refusal_ratio`'s (admission/config.py); the
controller gathers them (queue, meters, forecast) and turns a `Hopeless` answer into the 429
`queue_full` refusal. Kept apart from the controller so the arithmetic reads in one place:

    B      = ratio × max_wait_s(class)
    m      = OVERTAKE_MARGIN_SIGMAS × √(λ_above × B)
    need   = ahead + 1 + blocked + λ_above × B + m      slot releases within B
    queued ⇐ need − blocked ≤ λ_below × min(B, τ)        the classes below are being served (below)
    hopeless ⇔ need > C × B                              (expected wait (ahead + 1 + m) / (C − λ_above))
            or the held tickets are not expected to free ⌈need⌉ slots within B (`ReleaseForecast`)

`blocked`: slots held above the replicas' caps now (a learned cap cut below what runs): their releases
free nothing for a waiter, so they come first.

λ_below: waiters of the classes strictly below this one dispatched per second over the last seconds
(`PoolRates.below_per_s`, τ = `RECENT_TIME_CONSTANT_S`). The queue gives every slot to the highest
class waiting, so each of those dispatches would have been this arrival's: while they would serve it
within its budget, it is queued, whatever the forecast says. The forecast counts releases; in an
onset the slots come from learned caps growing with the batch, which it cannot see, and without this
rule a critical arrival was refused with a Retry-After of 15–50 s while interactive and batch
requests were dispatched in the next second (docs/bench-log/2026-12-06-priority-onset.md). `blocked`
is left out there: those dispatches came with the blocked slots in place. The rate is extrapolated no
further than it was measured (τ). The lowest class has nothing below it: unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from admission.dispatch_rate import RECENT_TIME_CONSTANT_S
from admission.release_forecast import ReleaseForecast

SLACK = 1e-9  # float noise in sums of rates must not cost a slot
OVERTAKE_MARGIN_SIGMAS = 2.0
"""Higher-class arrivals during a wait are Poisson: early refusal plans for their mean plus this many
standard deviations (√mean), so that a burst of them rarely turns an admitted waiter into a timeout."""


@dataclass(frozen=True, slots=True)
class Hopeless:
    """Why the arrival is refused, and when a retry could be admitted (`wait_s`; None: unknown)."""

    why: str
    wait_s: float | None


def hopeless(
    *,
    priority: str,
    ratio: float,
    max_wait_s: float,
    ahead: int,
    blocked: int = 0,
    capacity_per_s: float | None,
    above_per_s: float,
    forecast: ReleaseForecast,
    below_per_s: float = 0.0,
) -> Hopeless | None:
    """The early-refusal verdict for an arrival of class `priority` with `ahead` waiters at or above
    it (module docstring); None: queue it (also when there is no evidence: no capacity measured)."""
    budget_s = ratio * max_wait_s
    if capacity_per_s is None or not math.isfinite(capacity_per_s * budget_s):
        return None
    margin = OVERTAKE_MARGIN_SIGMAS * math.sqrt(above_per_s * budget_s)
    unblocked = ahead + 1 + above_per_s * budget_s + margin
    if unblocked <= below_per_s * min(budget_s, RECENT_TIME_CONSTANT_S) + SLACK:
        return None  # the slots the classes below are taking would be its
    need = unblocked + blocked
    available = capacity_per_s - above_per_s
    if need > capacity_per_s * budget_s + SLACK:
        if available <= 0:
            return Hopeless(f"the classes above {priority} take all of this pool's capacity", max_wait_s)
        wait_s = (ahead + 1 + blocked + margin) / available
        burst = " with a burst of higher-class arrivals" if margin > 0 else ""
        why = f"the {priority} queue would take about {wait_s:.1f} s{burst}, over its {max_wait_s:g} s limit"
        return Hopeless(why, wait_s)
    releases = math.ceil(need - SLACK)
    if forecast.releases_due(releases, budget_s) is False:
        why = (
            f"the {priority} queue needs {releases} replica slots freed within {budget_s:g} s "
            "and the requests running now are not expected to free them in time"
        )
        due_s = forecast.time_until_releases_s(releases)
        return Hopeless(why, None if due_s is None else due_s - budget_s)
    return None
