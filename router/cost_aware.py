"""Routing on what a request will cost: sticky-until-saturated prefix affinity, and the SLO-aware pick
on the learned latency model.

Both pickers keep a prefix index (`router.prefix_index`; they record where each request's blocks went)
and read the token-aware load of `router.load`: for candidate i,

    matched_i = leading request blocks replica i is believed to hold
    queued_i  = prefill_tokens_inflight_i + (prompt − matched_i · block tokens)   its own prefill included
    running_i = decoding requests (or the engine's fresh `running`, when larger)

Both are composite pickers: the τ budget (with the count bound) and the TPOT filter narrow the
candidates inside the picker, over every candidate the profile hands it, not as profile filters
(`router.filters` says why: as filters they would change the replica, branch, hops and `candidates`
of some decisions).

**`sticky-prefix`** (picker type): candidates in preference order — most matched blocks first, ties in
the order of the pool's consistent-hash ring walked from the request's prefix key (so the spill target
of a prefix is always the same next replica, which warms up too) — and the first that admits it
takes it: `queued_i ≤ τ_i` (its prefill backlog) and, unless `load_factor` is null, in-flight requests
under the CHWBL bound ceil(load_factor × (Σ in-flight + 1) / n) over the candidates (default 1.5:
prefill tokens say nothing of the decode batch, and a warm replica whose batch is full makes every
new request wait for KV space however short its uncached prefill):

    τ_i = prefill_budget_tokens                                when set, else
          prefill_tokens_per_s × ttft_penalty_s                when the rate is set, else
          learned prefill rate_i × ttft_penalty_s              (1000 / (a1 + a4) of i's TTFT model), else
          DEFAULT_PREFILL_BUDGET_TOKENS (8,192: one vLLM chunk on an H100)

τ is "how much prefill may queue on the warm replica before a cold one is faster": the TTFT penalty
the pool accepts (default 0.5 s) at the replica's peak prefill rate. Branches: `sticky` (the first
preference, holding part of the prefix), `prefix_miss` (first preference, nothing cached anywhere),
`spillover` (hops = preferences passed over), `all_over_bound` (every candidate over τ: the least
queued), `no_key` (no prefix blocks: the least queued).

**`predicted-latency`** (the SLO-aware picker): with every candidate's TTFT model warm,

    ttft_i = model_i.ttft(queued_i, running_i, waiting_i, own_i)   own_i = prompt − matched_i · block tokens
    tpot_i = model_i.tpot(running_i + 1, kv_i)
    meets_i ⇔ tpot_i ≤ request.slo_tpot_s (or unknown / no bound)
    choice  = argmin ttft_i over the candidates that meet TPOT or hold more of the request's prefix
              than the least-matching candidate (matched_i > min over the candidates); all of them
              when none does

The prefix benefit is inside `queued_i`. The TPOT filter spares the replicas that hold the prefix where
others do not: those are the busy ones (popular prefixes draw traffic), so past the fleet's knee a
strict filter sends their requests to replicas without the prefix — each a miss whose prefill slows that
replica's whole batch and leaves a second copy of the prefix in its cache. Sparing the holders keeps the
SLO goodput and cache hits a strict filter loses there (docs/bench-log/2026-12-05-rounds.md, "Sixth round"). A
prefix every replica holds (a common system prompt) spares none. Nothing else bounds a spared holder's
TPOT on such a pool — the learned cap is gated off where prefixes decide the prefill
(`gateway.upstream.replica_cost`) — and there the hit still beats the miss (same section).

Branch `slo_met` when the choice is predicted to meet both objectives, `slo_prefix_over_tpot` when a
spared prefix holder predicted over TPOT won, `slo_best_effort` otherwise (no replica can: the best one
still serves it; admission is what refuses work that cannot be served in time). A candidate whose model
is cold is predicted with the mean coefficients of the warm ones (one pool, one kind of hardware:
otherwise a replica nothing was sent to would never be chosen, so never learned); while no candidate's
model is warm the `sticky-prefix` rule decides, reported as `cold_model`. The decision carries both
predictions (`x-gateway-route: …; predicted_ttft_ms=…; predicted_tpot_ms=…`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.bounded import LoadBound
from router.indexed_picker import IndexedPicker
from router.latency_model import PREFILL_TOKENS_SCALE, LatencyEstimate
from router.load import queued_prefill_tokens, running_sequences, waiting_requests
from router.pickers import best_score_index
from router.prefix_index import PrefixIndex
from router.profile import Pick
from router.ring import DEFAULT_VIRTUAL_NODES_PER_REPLICA, RingCache
from router.scorers import kv_usage
from router.types import Branch, ReplicaView, RouteDetail, RoutingRequest

DEFAULT_PREFILL_BUDGET_TOKENS = 8192
DEFAULT_TTFT_PENALTY_S = 0.5
DEFAULT_STICKY_LOAD_FACTOR = 1.5


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    """τ, the queued prefill tokens a warm replica may hold before a request spills (module docstring)."""

    budget_tokens: int | None = None
    prefill_tokens_per_s: float | None = None
    ttft_penalty_s: float = DEFAULT_TTFT_PENALTY_S

    def tokens_for(self, replica: ReplicaView) -> float:
        """τ for `replica`."""
        if self.budget_tokens is not None:
            return float(self.budget_tokens)
        if self.prefill_tokens_per_s is not None:
            return self.prefill_tokens_per_s * self.ttft_penalty_s
        learned = _learned_prefill_tokens_per_s(replica)
        if learned is not None:
            return learned * self.ttft_penalty_s
        return float(DEFAULT_PREFILL_BUDGET_TOKENS)


def _learned_prefill_tokens_per_s(replica: ReplicaView) -> float | None:
    """1000 / (a1 + a4) of the replica's warm TTFT model, when positive: a1 + a4 is the seconds per
    1,000 tokens a request's own prefill costs (`router.latency_model`), the engine's prefill rate."""
    estimate = replica.latency
    if estimate is None or estimate.ttft is None:
        return None
    seconds_per_1000 = estimate.ttft[1] + estimate.ttft[4]
    return PREFILL_TOKENS_SCALE / seconds_per_1000 if seconds_per_1000 > 0 else None


class StickyPrefixPicker(IndexedPicker):
    """Sticky until saturated (module docstring); records the request's blocks where it goes."""

    def __init__(
        self,
        index: PrefixIndex,
        budget: PrefillBudget,
        rng: random.Random,
        virtual_nodes_per_replica: int = DEFAULT_VIRTUAL_NODES_PER_REPLICA,
        bound: LoadBound | None = None,
    ) -> None:
        super().__init__(index)
        self._budget = budget
        self._bound = bound
        self._rng = rng
        self._rings = RingCache(virtual_nodes_per_replica)

    def choose(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
        matched: Mapping[str, int],
    ) -> Pick:
        """The sticky-until-saturated choice, without recording it."""
        blocks = [matched[r.replica_id] for r in replicas]
        queued = [queued_prefill_tokens(r, request, m) for r, m in zip(replicas, blocks, strict=True)]
        if not request.prefix_hashes or request.prefix_key is None:
            return self._least_queued(queued, Branch.NO_KEY)
        order = self._preference(request.prefix_key, replicas, blocks, pool)
        limit = 0 if self._bound is None else self._bound.limit(request, replicas)
        for hops, index in enumerate(order):
            replica = replicas[index]
            under_bound = self._bound is None or self._bound.admits(replica, limit)
            if under_bound and queued[index] <= self._budget.tokens_for(replica):
                first = Branch.STICKY if blocks[index] else Branch.PREFIX_MISS
                branch = Branch.SPILLOVER if hops else first
                return Pick(index, branch, {"hops": hops})
        return self._least_queued(queued, Branch.ALL_OVER_BOUND)

    def _preference(
        self, key: int, replicas: list[ReplicaView], matched: list[int], pool: Sequence[ReplicaView]
    ) -> list[int]:
        """Candidate indices: most matched blocks first, ties in ring order from `key`."""
        rank = {replica_id: i for i, replica_id in enumerate(self._rings.ring_for(pool).walk(key))}
        last = len(rank)
        return sorted(
            range(len(replicas)), key=lambda i: (-matched[i], rank.get(replicas[i].replica_id, last))
        )

    def _least_queued(self, queued: list[int], branch: Branch) -> Pick:
        return Pick(index=best_score_index([-float(q) for q in queued], self._rng), branch=branch)


class PredictedLatencyPicker(IndexedPicker):
    """The SLO-aware pick on the learned latency models (module docstring)."""

    def __init__(self, index: PrefixIndex, fallback: StickyPrefixPicker, rng: random.Random) -> None:
        super().__init__(index)
        self._fallback = fallback
        self._rng = rng

    def choose(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
        matched: Mapping[str, int],
    ) -> Pick:
        estimates = _with_pool_prior([replica.latency for replica in replicas])
        if estimates is None:
            cold = self._fallback.choose(request, replicas, scores, pool, matched)
            return Pick(cold.index, Branch.COLD_MODEL, cold.detail)
        held = [matched[replica.replica_id] for replica in replicas]
        ttft: list[float] = []
        tpot: list[float | None] = []
        for replica, estimate, blocks in zip(replicas, estimates, held, strict=True):
            running = running_sequences(replica)
            queued = queued_prefill_tokens(replica, request, blocks)
            own = request.uncached_tokens(blocks)
            waiting = waiting_requests(replica)
            predicted = estimate.ttft_s(queued, running, waiting, own, replica.since_last_token_s)
            assert predicted is not None  # every estimate has a warm TTFT model here
            ttft.append(predicted)
            tpot.append(estimate.tpot_s(running + 1, kv_usage(replica)))
        slo_tpot = request.slo_tpot_s
        meets = [slo_tpot is None or t is None or t <= slo_tpot for t in tpot]
        least_held = min(held)  # a holder of more than that is spared the TPOT filter (module docstring)
        allowed = [i for i, ok in enumerate(meets) if ok or held[i] > least_held] or list(range(len(held)))
        best = allowed[best_score_index([-ttft[i] for i in allowed], self._rng)]
        met = meets[best] and (request.slo_ttft_s is None or ttft[best] <= request.slo_ttft_s)
        branch = Branch.SLO_MET if met else Branch.SLO_BEST_EFFORT
        if not meets[best] and any(meets[i] for i in allowed):  # a holder over TPOT beat one within it
            branch = Branch.SLO_PREFIX_OVER_TPOT
        detail: RouteDetail = {"predicted_ttft_s": ttft[best]}
        predicted_tpot = tpot[best]
        if predicted_tpot is not None:
            detail["predicted_tpot_s"] = predicted_tpot
        return Pick(best, branch, detail)


def _with_pool_prior(estimates: list[LatencyEstimate | None]) -> list[LatencyEstimate] | None:
    """Each candidate's estimate, a replica whose model is cold borrowing the mean of the warm ones'
    coefficients (the replicas of a pool share their hardware; without this, a replica nothing was
    sent to would never be predicted, so never chosen, so never learned). None when none is warm."""
    warm = [e for e in estimates if e is not None and e.ttft is not None]
    if not warm:
        return None
    ttfts = [e.ttft for e in warm if e.ttft is not None]
    tpots = [e.tpot for e in warm if e.tpot is not None]
    a = _column_means(ttfts)
    b = _column_means(tpots) if tpots else None
    prior = LatencyEstimate(ttft=tuple(a), tpot=None if b is None else tuple(b))
    filled = []
    for estimate in estimates:
        if estimate is None or estimate.ttft is None:
            filled.append(prior)
        elif estimate.tpot is None:
            filled.append(LatencyEstimate(ttft=estimate.ttft, tpot=prior.tpot))
        else:
            filled.append(estimate)
    return filled


def _column_means(rows: Sequence[tuple[float, ...]]) -> list[float]:
    return [sum(column) / len(rows) for column in zip(*rows, strict=True)]


def prefill_tokens_metric(replica: ReplicaView) -> float:
    """The `prefill-tokens` scorer's metric: uncached prefill tokens in flight on the replica."""
    return float(replica.prefill_tokens_inflight)
