"""Pickers for the simple presets: round robin, best score, and power of two choices.

Ties are always broken by the injected seeded `random.Random`, so a decision is reproducible under a
seed and never biased towards the first replica of the snapshot.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.load import request_load
from router.profile import Pick
from router.types import Branch, ReplicaView, RoutingRequest

_SCORE_EPSILON = 1e-9


def best_score_index(scores: Sequence[float], rng: random.Random) -> int:
    """Index of the highest score; ties (within 1e-9) broken by `rng`."""
    best = max(scores)
    tied = [i for i, s in enumerate(scores) if best - s <= _SCORE_EPSILON]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


class RoundRobinPicker:
    """Cycles through the candidates in replica-id order; the cursor survives membership changes.

    The cursor is a plain counter: the n-th call picks candidate `n mod len(candidates)` of the
    id-sorted list, so a replica joining or leaving only shifts the cycle, never stalls it.
    """

    def __init__(self) -> None:
        self._cursor = 0

    def __call__(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
    ) -> Pick:
        order = sorted(range(len(replicas)), key=lambda i: replicas[i].replica_id)
        index = order[self._cursor % len(order)]
        self._cursor += 1
        return Pick(index=index, branch=Branch.ROUND_ROBIN)


class MaxScorePicker:
    """Picks the highest combined score; ties are broken by the injected seeded RNG."""

    def __init__(self, rng: random.Random, branch: Branch = Branch.LEAST_LOAD) -> None:
        self._rng = rng
        self._branch = branch

    def __call__(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
    ) -> Pick:
        if len(replicas) == 1:
            return Pick(index=0, branch=Branch.SINGLE_CANDIDATE)
        return Pick(index=best_score_index(scores, self._rng), branch=self._branch)


class PowerOfTwoPicker:
    """Samples two distinct candidates with the RNG and keeps the less loaded one.

    load = gateway in-flight requests + the engine's waiting queue when its sample is fresh
    (`router.load.request_load`); on equal load the first sampled wins (it is random already).
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def __call__(
        self,
        request: RoutingRequest,
        replicas: list[ReplicaView],
        scores: list[float],
        pool: Sequence[ReplicaView],
    ) -> Pick:
        if len(replicas) == 1:
            return Pick(index=0, branch=Branch.SINGLE_CANDIDATE)
        first, second = self._rng.sample(range(len(replicas)), 2)
        if request_load(replicas[second]) < request_load(replicas[first]):
            first = second
        return Pick(index=first, branch=Branch.POWER_OF_TWO)
