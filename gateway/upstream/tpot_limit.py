"""A replica's concurrency limit found from its observed TPOT: the adaptive concurrency-limit idea
(Netflix's gradient limit, Envoy's adaptive concurrency filter) with the TPOT objective as the target.

Why not the TPOT model's solved batch (`router.latency_model`): it solves TPOT(batch) = objective on
an affine law of the batch and the KV in use, which holds when decode work is what slows tokens down
(and even then it extrapolated badly below the knee). Past the knee of a long-prompt workload, what
slows them down is the prefill chunks interleaved with the decode steps (a step carrying 8,192 prefill
tokens takes 0.5 s on an H100 13B), whose rate is the dispatch rate, not the batch: the affine law then
sees no cost in the batch and finds no cap, while TPOT breaks the objective for everyone. A limit driven
by the measured TPOT needs no model of why. Every `update_every` samples (default 8), with `tpot` the
exponentially weighted mean of the samples (weight 0.2) and the set point `target = target_ratio ×
tpot_slo_s` (`target_ratio` default 1.0):

    gradient  = clamp(target / tpot, 0.5, 1)
    no limit yet and tpot ≤ target     → still none (nothing to limit)
    no limit yet and tpot > target     → limit = inflight × gradient       (starts from what runs now)
    otherwise                          → limit = limit × gradient + (√limit if gradient = 1 else 0)

clamped to [min_limit, max_limit] (max: the configured cap, when one is set). So a limit appears only
once the objective is broken, shrinks by at most half per update while it is, and grows by √limit per
update while the objective holds (the Netflix "queue size" headroom), which probes for more.

Samples from before the last change are held to what that change acted on. A TPOT is known when its
request ends, a whole generation after it was admitted (2-3 s for 128 tokens at 16-20 ms), and at 25
requests/s a replica finishes 8 requests every third of a second: a limit that read every sample the
same way cut again and again on samples of requests admitted before its first cut, undershot (TPOT p50
13-15 ms for a 16 ms set point) and gave up goodput at 1.5x the knee (issue 15). So when `observe` is
told when the request was dispatched (`started_at_s`) and the time now (`now_s`), each change records
its time and the mean TPOT it acted on, and restarts the means: samples of requests dispatched since
the change update the limit as above; samples of requests dispatched before it have a mean of their
own, compared with the level already acted on instead of the target — they cut further only when the
load grew past it (gradient = acted-on / mean, same clamp), and never grow the limit. Skipping them
altogether was tried: at 2x the knee the first cut comes from the first, still light, samples, and
waiting out a drain and a generation for fresh ones left the limit too high for a third of the run
(0.52x of the knee's goodput). Without the times (tests, callers that do not know them) every sample
counts as fresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_UPDATE_EVERY = 8
TPOT_WEIGHT = 0.2
MIN_GRADIENT = 0.5
DEFAULT_TARGET_RATIO = 1.0


@dataclass(slots=True)
class _Samples:
    """An exponentially weighted mean of TPOT samples (weight `TPOT_WEIGHT`) and how many it holds."""

    mean_s: float | None = None
    count: int = 0

    def add(self, tpot_s: float) -> float:
        self.mean_s = tpot_s if self.mean_s is None else self.mean_s + TPOT_WEIGHT * (tpot_s - self.mean_s)
        self.count += 1
        return self.mean_s


class TpotConcurrencyLimit:
    """The gradient limit of one replica (module docstring); `limit` is None until it is needed."""

    __slots__ = (
        "_acted_on_s",
        "_changed_at_s",
        "_fresh",
        "_max",
        "_min",
        "_stale",
        "_target_s",
        "_update_every",
        "limit",
    )

    def __init__(
        self,
        tpot_slo_s: float,
        *,
        min_limit: int,
        max_limit: int | None = None,
        update_every: int = DEFAULT_UPDATE_EVERY,
        target_ratio: float = DEFAULT_TARGET_RATIO,
    ) -> None:
        if tpot_slo_s <= 0 or min_limit < 1 or update_every < 1 or not 0 < target_ratio <= 1:
            raise ValueError("tpot_slo_s, min_limit, update_every must be positive, target_ratio in (0, 1]")
        self._target_s = tpot_slo_s * target_ratio
        self._min = min_limit
        self._max = max_limit
        self._update_every = update_every
        self.limit: float | None = None
        self.reset()

    @property
    def cap(self) -> int | None:
        """The limit as a whole number of requests, None while there is none."""
        return None if self.limit is None else max(self._min, math.floor(self.limit))

    def reset(self) -> None:
        """Forget the limit and the samples (no limit until the objective breaks again)."""
        self.limit = None
        self._fresh, self._stale = _Samples(), _Samples()
        self._changed_at_s: float | None = None
        self._acted_on_s: float | None = None

    def observe(
        self, tpot_s: float, inflight: int, *, started_at_s: float | None = None, now_s: float | None = None
    ) -> None:
        """One finished request's TPOT, with `inflight` requests on the replica now; `started_at_s`
        (when it was dispatched) and `now_s`, on one clock, when known (module docstring)."""
        if not math.isfinite(tpot_s) or tpot_s <= 0:
            return
        timed = started_at_s is not None and now_s is not None
        changed = self._changed_at_s
        stale = timed and changed is not None and started_at_s is not None and started_at_s < changed
        samples = self._stale if stale else self._fresh
        mean_s = samples.add(tpot_s)
        if samples.count % self._update_every:
            return
        # a stale sample is held to the level the last change already acted on: it may cut further
        # (the load grew since), never grow
        reference_s = self._acted_on_s if stale and self._acted_on_s is not None else self._target_s
        gradient = min(1.0, max(MIN_GRADIENT, reference_s / mean_s))
        if self.limit is None:
            if gradient >= 1.0:
                return
            new = max(inflight, self._min) * gradient
        elif stale:
            if gradient >= 1.0:
                return
            new = self.limit * gradient
        else:
            new = self.limit * gradient + (math.sqrt(self.limit) if gradient >= 1.0 else 0.0)
        if self._max is not None:
            new = min(new, float(self._max))
        new = max(float(self._min), new)
        if timed and new != self.limit:
            self._changed_at_s = now_s
            self._acted_on_s = mean_s if gradient < 1.0 else None
            self._fresh, self._stale = _Samples(), _Samples()
        self.limit = new
