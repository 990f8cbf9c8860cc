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

Why the presets keep the bound and the guard inside their pickers (`bounded-ring`, `prefix-index`)
instead of running these filters: a filter changes what the scorers normalise over and what the
picker's fallback and tie-break choose among, and `Decision.candidates` would count the filtered set.
`filters: [load-bound]` + picker `ring` agrees with `bounded-ring` on every request with a key (the
same replica, branch and hops), but not always on requests without one. The filters are for custom
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
