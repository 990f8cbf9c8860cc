"""Filter plugins: narrow the eligible candidates before scoring. Both are soft: they never empty the set.

    load-bound       keep the candidates under the CHWBL bound (router.bounded.LoadBound):
                         limit = ceil(load_factor · (Σ load_i + w) / n)  over the n candidates given,
                         keep i  ⇔  load_i < limit   (all kept when none is; c ≥ 1 makes that impossible)
                     options: load_factor (1.25, ≥ 1), load_unit (requests | tokens, default requests)
    imbalance-guard  when the candidates are imbalanced (router.prefix_index.ImbalanceGuard) over
                     load = in-flight + fresh engine waiting:
                         max - min > imbalance_abs_requests  and  max > imbalance_rel_ratio · min,
                     keep only the least loaded (every candidate tied at the minimum); else keep all
                     options: imbalance_abs_requests (16, ≥ 0), imbalance_rel_ratio (1.5, ≥ 1)

Composite pickers. Four pickers run a stage that narrows like a filter inside themselves, over every
candidate the profile hands them: `bounded-ring` (this load bound, then the ring walk), `prefix-index`
(this imbalance guard, then the best score), `sticky-prefix` (the τ budget and a count bound, tested in
preference order) and `predicted-latency` (the TPOT filter, on the predictions its TTFT choice reads;
`router.cost_aware`). None is a profile filter, because a filter runs before the scorers and the
picker and hands them fewer candidates, which changes decisions:
- the scorers normalise over, and the picker's fallback and tie-break choose among, the filtered set;
- `Decision.candidates` counts the filtered set (every preset reports the eligible candidates);
- a stage tested in the picker's own order is part of its answer: `sticky-prefix`'s hops count the
  preferences passed over τ and its branch is `spillover` when the first one was, its fallbacks take
  the least queued of all candidates, and its count bound's limit is computed over all of them;
- `predicted-latency`'s filter shares its predictions with the choice (a cold model borrows the mean
  of every warm candidate's), spares the holders of more of the prefix than the least-matching
  candidate, and its branch says whether a candidate within TPOT was passed over.
`filters: [load-bound]` + picker `ring` agrees with `bounded-ring` on every request with a key (the
same replica, branch and hops), but not always on requests without one. These filters are for custom
profiles (e.g. the bound in front of `max-score` or `power-of-two`).
"""

from __future__ import annotations

from router.bounded import LoadBound
from router.load import request_load
from router.prefix_index import ImbalanceGuard
from router.types import ReplicaView, RoutingRequest


class LoadBoundFilter:
    """Keeps the candidates under the CHWBL bound computed over the candidates it is given."""

    name = "load-bound"

    def __init__(self, bound: LoadBound) -> None:
        self._bound = bound

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[ReplicaView]:
        limit = self._bound.limit(request, replicas)
        admitted = [replica for replica in replicas if self._bound.admits(replica, limit)]
        return admitted or replicas


class ImbalanceFilter:
    """When the guard sees imbalance, keeps only the least-loaded candidates; otherwise all of them."""

    name = "imbalance-guard"

    def __init__(self, guard: ImbalanceGuard) -> None:
        self._guard = guard

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[ReplicaView]:
        loads = [request_load(replica) for replica in replicas]
        if not self._guard.imbalanced(loads):
            return replicas
        lowest = min(loads)
        return [replica for replica, load in zip(replicas, loads, strict=True) if load <= lowest]
