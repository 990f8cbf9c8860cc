"""A routing policy as a profile: filters → weighted scorers → one picker.

    eligible = lora_slots(eligible_replicas(replicas))  (always first: the one definition of eligible,
                                                         router.eligibility; then router.lora, soft)
    for f in filters:  eligible = f(request, eligible)        (in order; stops early when empty)
    score_i  = Σ_k weight_k · scorer_k(request, eligible)_i   (each scorer returns values in [0, 1])
    decision = picker(request, eligible, scores, pool=replicas)

Weights default to 1.0 and must be ≥ 0; with no scorers every score is 0 and the picker decides alone.
A *composite* picker runs a narrowing stage of its own inside, over every candidate it is given (the
CHWBL bound, the imbalance guard, the τ budget, the TPOT filter): `router.filters` says why those are
not filters. The decision's generic fields — replica, policy, branch and `candidates` (how many the
filters left) — are the profile's; what the picker says of its choice (hops, prefix blocks, predicted
latencies) is `Decision.detail` (`router.types.RouteDetail`).

A behaviour is a new filter, scorer or picker plus configuration, never an `if` in the orchestrator:
`router.plugins` registers the types by name (with their options and defaults), `router.profile_spec`
builds a profile from a spec, `router.presets` spells the named policies as such specs.
`Profile.decide` returns `None` only when no replica is eligible (or a filter left none); the gateway
turns that into `503 no_replica`.

Deciding and recording are two steps. A picker that remembers where requests went (a prefix index:
`Recorder`) records a decision when it is committed — by default at once (`decide(commit=True)`), or
later (`decide(commit=False)`, then `commit`) when the caller may still drop it: a disaggregated pool
decides on its prefill set, then on its decode set, and claims (and commits) only when both have room,
so a request waiting for decode room never finds its own unsent prefill in the index. Only prefix
indexes wait for the commit: a picker's other state (round robin's cursor) moves at decision time,
so a dropped prefill decision still advances a round-robin prefill set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from router.eligibility import eligible_replicas, is_routable
from router.lora import lora_slots
from router.types import Branch, Decision, ReplicaView, RouteDetail, RoutingRequest

if TYPE_CHECKING:
    from router.prefix_index import PrefixIndex


class Filter(Protocol):
    """Narrows the candidate list: returns a subset of the replicas it was given, in their order."""

    name: str

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[ReplicaView]: ...


class Scorer(Protocol):
    """Scores each candidate in [0, 1]; higher is better."""

    name: str

    def __call__(self, request: RoutingRequest, replicas: list[ReplicaView]) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class Pick:
    """A picker's answer: index into the candidate list, the branch, and the picker's own account
    (`router.types.RouteDetail`: only the keys it knows)."""

    index: int
    branch: Branch
    detail: RouteDetail = field(default_factory=RouteDetail)


class Picker(Protocol):
    """Chooses one candidate given the combined scores.

    `pool` is the whole snapshot the candidates were drawn from (eligible or not): ring pickers take
    their membership from it, so health flaps and retry exclusions never rebuild or reshape a ring.
    """

    def __call__(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
    ) -> Pick: ...


@runtime_checkable
class Recorder(Protocol):
    """A picker that remembers where requests went: told of each committed decision (module docstring)."""

    def record(self, request: RoutingRequest, replica_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """The replica a request's key maps to, full or not, how many of its leading blocks that replica is
    believed to hold (`router.prefix_wait.key_owner_wait`), and whether its load is under the ring's
    bound over the same candidates (`under_bound`; True for a ring without one): what may still send
    the request there past a learned cap (`gateway.proxy.admit.PoolAdmission.try_dispatch`)."""

    replica_id: str
    matched_blocks: int
    under_bound: bool = True


@runtime_checkable
class OwningPicker(Protocol):
    """A picker that routes on a key (the rings): names the key's owner among the candidates, ignoring
    loads and caps — where the request would go if the owner had room."""

    def owner(
        self, request: RoutingRequest, candidates: Sequence[ReplicaView], pool: Sequence[ReplicaView]
    ) -> KeyOwner | None: ...


class Policy(Protocol):
    """What the gateway calls: a pure decision over a snapshot, recorded when committed (module
    docstring)."""

    name: str

    def decide(
        self, request: RoutingRequest, replicas: Sequence[ReplicaView], *, commit: bool = True
    ) -> Decision | None: ...

    def commit(self, request: RoutingRequest, decision: Decision) -> None: ...


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    """A scorer with its weight in the profile's weighted sum."""

    scorer: Scorer
    weight: float = 1.0


class Profile:
    """Composes filters, weighted scorers and a picker into a `Policy`. `prefix_index` is the index its
    picker keeps, if any (`router.prefix_index.IndexedPolicy`: how the gateway shares it)."""

    def __init__(
        self,
        name: str,
        picker: Picker,
        scorers: Sequence[WeightedScorer] = (),
        filters: Sequence[Filter] = (),
        prefix_index: PrefixIndex | None = None,
    ) -> None:
        self.name = name
        self.prefix_index = prefix_index
        self._picker = picker
        self._recorder = picker if isinstance(picker, Recorder) else None
        self._owning = picker if isinstance(picker, OwningPicker) else None
        self._scorers = tuple(scorers)
        self._filters = tuple(filters)

    def decide(
        self, request: RoutingRequest, replicas: Sequence[ReplicaView], *, commit: bool = True
    ) -> Decision | None:
        """The decision over `replicas`, None when none is eligible; committed at once unless `commit`
        is False (then `commit` it if it is taken, or drop it)."""
        candidates = lora_slots(request, eligible_replicas(request, replicas))
        for narrow in self._filters:
            if not candidates:
                break
            candidates = narrow(request, candidates)
        if not candidates:
            return None
        scores = self._combined_scores(request, candidates)
        pick = self._picker(request, candidates, scores, replicas)
        decision = Decision(
            replica_id=candidates[pick.index].replica_id,
            policy=self.name,
            branch=pick.branch,
            candidates=len(candidates),
            detail=pick.detail,
        )
        if commit:
            self.commit(request, decision)
        return decision

    def commit(self, request: RoutingRequest, decision: Decision) -> None:
        """Record `decision` where the picker remembers requests (its prefix index); nothing otherwise.
        Commit each decision once: a second commit records the request's blocks again (harmless for the
        index, which refreshes them, but not what happened)."""
        if self._recorder is not None:
            self._recorder.record(request, decision.replica_id)

    @property
    def routes_on_key(self) -> bool:
        """Its picker routes on a key and can name the key's owner (`key_owner`)."""
        return self._owning is not None

    def key_owner(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> KeyOwner | None:
        """The request's key owner among the replicas that could take it were they not full (routable,
        serving its model, not excluded; `OwningPicker`), None when the picker routes on no key or the
        request has none."""
        if self._owning is None:
            return None
        candidates = [
            r
            for r in replicas
            if is_routable(r) and r.serves(request.model) and r.replica_id not in request.exclude
        ]
        return self._owning.owner(request, candidates, replicas) if candidates else None

    def _combined_scores(self, request: RoutingRequest, candidates: list[ReplicaView]) -> list[float]:
        totals = [0.0] * len(candidates)
        for weighted in self._scorers:
            for i, value in enumerate(weighted.scorer(request, candidates)):
                totals[i] += weighted.weight * value
        return totals
