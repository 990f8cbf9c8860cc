"""Trunk reservation on the learned cap: the lowest class leaves the top of it to the classes above.

A replica's learned cap (`gateway.upstream.tpot_limit`) is the batch at which the engine holds the TPOT
objective. Past the knee every freed slot is taken at once. The lowest class (batch) may wait longest —
its wait is not bounded by the TTFT objective — so without a reservation it sits in the queue and takes
the slots as they free, while an interactive or critical arrival, which must be dispatched within its
share of the TTFT objective, finds the replicas full and is refused at arrival: priority inverted.
Telephony's answer is trunk reservation: a lower class is admitted only while some capacity stays free
for the classes above. Here, while a class above the lowest has demand (≥ `MIN_DEMAND_PER_S` arrivals
per second, the controller's arrival meters), a request of the lowest class may fill

    cap_share = 1 − reserve                       (default reserve 0.1: 90 % of the cap)

of a replica's learned cap, max(1, ⌊learned × cap_share⌋) requests (`Replica.effective_max_concurrency`);
every other class, and the lowest when nothing above it arrives, fills the whole cap. So what runs never
exceeds the cap (it keeps steering the engine's TPOT), a pool serving only batch work loses nothing, and
under overload the lowest class is dispatched only when the classes above leave room. Early refusal
counts the classes above by their arrivals (`PoolRates.above_per_s`), so the lowest class is also the
first refused at arrival. A hand-set `max_concurrency_per_replica` (no learned cap) is not scaled, and
a disaggregated pool's pair claims (`gateway.proxy.disagg.admit`) and a retry's claim use the whole cap
(the top class's borrow below included).

The top class: the reserve covers the slots that free up, not the ones already held. When a cap is cut
below what runs (an overload's onset: every replica's first cut within a few seconds), nothing frees
for a generation, and a `critical` arrival was refused at arrival while `batch` requests dispatched
before the cut ran on (9–15 of 194 critical arrivals at 1.5× the knee, all in the first cut:
docs/bench-log/2026-12-06-top-class-place.md). An engine cannot preempt a running sequence, but the
cap can lend its place: a request of the highest of several classes may run above a replica's learned
cap by as many requests of the lowest class as run there (`Replica.lowest_class_inflight`, counted by
the slot; `CapTier` in `router.types`):

    top-class cap = learned cap (less the others' requests there) + lowest-class requests there

Every other class still sees the cap, so what the top class took comes back as the next releases go
to no one below it: the batch class pays with its next slots, and the latency the cap steers counts
the extra sequences like any others. A configured `max_concurrency_per_replica` and shared slot credits
still bound the sum (`Replica.effective_max_concurrency`: the lease cap in Redis bounds every
instance's requests together); with a single class nothing changes. Where a cap share stretches the
cap (a waiter at its deadline, a ring's owner kept: × 1 / `tpot_target_ratio`), the borrow is added
to the stretched cap.

Several gateway instances: a learned cap is on the engine's whole batch, so each instance subtracts
the requests the others run there (`ReplicaCost.foreign_requests`). Lending only its own lowest-class
places (about 1/k of the engine's) while bearing the engine's whole excess over the cap, an instance
refused critical arrivals in the onset again (docs/bench-log/2026-12-06-shared-lowest-class.md). With
Redis state every instance's lowest-class requests on the replica count, the others' exchanged every
250 ms (`gateway.fleet.lowest_class_sharing`) and never more than the others' requests subtracted; with
memory state, or Redis unreachable, only the instance's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MIN_DEMAND_PER_S = 0.1
"""Arrivals per second of the classes above under which the lowest class fills the whole cap (one
arrival in ten seconds, the meters' time constant)."""


def cap_share(
    priority: str, class_names: Sequence[str], reserve: float, above_demand_per_s: Callable[[], float]
) -> float:
    """The share of a learned cap a request of class `priority` may fill (module docstring): 1 − reserve
    for the lowest of `class_names` (highest first) while the classes above it have demand, else 1.
    `above_demand_per_s` is read only for the lowest class (every other claim skips the meters)."""
    if reserve <= 0 or len(class_names) < 2 or priority != class_names[-1]:
        return 1.0
    return 1.0 - reserve if above_demand_per_s() >= MIN_DEMAND_PER_S else 1.0
