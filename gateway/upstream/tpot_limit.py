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

    gradient  = clamp(target / tpot, 0.5, 1)       (paced: clamp(target / tpot, 0.5, 2))
    no limit yet and tpot ≤ target     → still none (nothing to limit)
    no limit yet and tpot > target     → limit = inflight × gradient       (starts from what runs now)
    unpaced                            → limit = limit × gradient (+ √limit while held)
    paced                              → limit = limit × gradient^share (+ share × √limit while held),
                                         growth bounded by max(limit, 2 × inflight)
    share = min(1, update_every / inflight)

clamped to [min_limit, max_limit] (max: the configured cap, when one is set). So a limit appears only
once the objective is broken, shrinks by at most half per update (paced: per generation) while it is,
and grows by √limit per update (paced: per generation, and by the gradient while TPOT is below the set
point) while the objective holds (the Netflix "queue size" headroom), which probes for more.

Why `paced` (off in this class, which is then the plain gradient limit; on in a pool by default,
`latency_model.cap_paced_by_generation`): a TPOT is known when its request ends, a generation after its
admission, and a replica running L requests finishes about L of them per generation, so L / update_every
updates happen before the first sample that reflects the first of them. Unpaced, each of those updates
takes a whole step: while broken the cuts compound on samples from before the first (the batch drains
below what the objective allows), while held the limit grows by √L each time (L / update_every × √L per
generation: at L = 40, 5 × 6.3, +80 %) and overshoots before any sample can say so. Paced, each update
takes its share of one generation's step, so a generation moves the limit by about × gradient or + √L —
Netflix's step per round trip, with the round trip a generation. Paced, it also grows by the gradient
(up to × 2 per generation) while TPOT is below the set point: a cut that went too far (the samples of
the first generation after the onset all predate the first cut) climbs back in a few generations instead
of √L at a time. It grows no further than twice what runs on the replica (a limit grown through a quiet
night would otherwise meet the next overload far above any batch it has seen, and the share, taken on
what runs, keeps cuts from it at one step per generation). The first cut (no limit yet) is always whole:
the onset of an overload is where a late cut costs most. Measured on a decode-bound fleet at 1.5× and 2×
its knee (docs/bench-log/2026-12-05-rounds.md, "Fourth round"; two rounds): paced 1.04–1.06× and
1.00–1.01× of the knee's SLO goodput, TPOT p99 21–22 ms; unpaced 0.91–0.95× and 0.88×, TPOT p99 25–31
ms. Damping the steps by a constant instead lost (0.87–0.92× at 1.5×).

Fast samples (`observe_window`): where the engine exports an inter-token latency histogram, every
scrape that closes a window (`gateway.upstream.engine_metrics.adapter`) gives the replica's own mean
token latency over the last interval, at the batch it ran (engine running + waiting, every gateway
instance's requests together). Such a sample lags an admission by a prefill, not a generation. The
limit steers the exponentially weighted mean (`WINDOW_SMOOTHING`) of the samples, each held to at most
`WINDOW_CEILING_RATIO` × the set point, and takes a damped step from the batch that ran, not from the
limit (gradient = set point / that mean, clamped to [0.5, 2]):

    first cut             limit = batch × gradient^WINDOW_GAIN, once batch ≥ BIRTH_BATCH_RATIO × floor
    latency over target   limit = min(limit, batch × gradient^WINDOW_GAIN)
    latency under target  limit = min(max(limit, batch × gradient^WINDOW_GAIN), WINDOW_HEADROOM × batch)

Why from the batch: a cut frees no slot until requests finish, so the batch — and the latency — stay
high for up to a generation after it, and cuts compounded on the limit would take it far below what
the objective allows (every dispatch then stops until the batch drains: queued requests time out).
Anchored to what runs, a cut goes as far as the latency the current batch shows, once; while the
latency stays over target the limit follows the batch down as it drains, so a sustained overload
still converges within about a generation. The first cut is damped like the others: a burst of cold
prompts (every one a full prefill) can show several times the target for a few seconds and then pass,
and a whole step there stopped every dispatch until half the batch had finished.

The first cut: no limit is born under a batch of `BIRTH_BATCH_RATIO` × the floor. From a smaller batch
even the damped step (at least × 0.81) lands on the floor, and a limit at the floor regrows by under a
request a window. A cold engine's first windows carry its first requests' full prefills: traced at the
knee on the shared-prefix fleet (docs/bench-log/2026-12-05-cold-onset.md), three of four replicas were
cut on their first window, at a batch of 7-9, and took 15 s to regain the batch the objective allows,
while the fourth, uncut, took their spill and stalled on its prefill queue.

Stalls: why each sample is held to twice the set point. The gradient's floor (0.5) already makes a window
above that cut no deeper; unheld, its memory would: an engine stalled on a prefill queue shows windows of
ten times the set point, and the mean of such windows stayed over the set point for five seconds after
the stall had ended, with the limit held below the batch. The futile-cut check judges the latency as
measured, unheld (a drain from three to two and a half times the set point is not flat).

Cuts that do not lower the latency are undone, and a limit held at the floor is probed at twice it
(`gateway.upstream.cut_check`): an engine slower than the objective at every batch is served at the
load it has, not throttled to the floor while its queue times out.

From the first fast sample on, finished requests' TPOTs no longer move the limit (they describe the
batch of a generation ago). With fast samples the limit is on the engine's whole batch, not one
instance's requests: the replica subtracts the others' share before routing reads it
(`gateway.upstream.replica`).

The set point is trimmed by what the finished requests' TPOTs say (`gateway.upstream.set_point_trim`):
the limit steers the engine's mean token latency, the objective judges each request's own TPOT.

Why a set point below the objective: the limit holds the *mean* TPOT at its target, and requests
scatter around the mean (prefill chunks land on some requests' steps more than on others'), so with
the target at the objective itself about a third of the admitted requests break it (325 of 934 at 1.5×
the knee: docs/bench-log/2026-12-05-rounds.md, "Item 5 with default settings: the issue's own case"). A
target below the objective trades batch for attainment.
"""

from __future__ import annotations

import math

from gateway.upstream.cut_check import PROBE_FACTOR, CutCheck
from gateway.upstream.set_point_trim import SetPointTrim

DEFAULT_UPDATE_EVERY = 8
TPOT_WEIGHT = 0.2
MIN_GRADIENT = 0.5
MAX_PACED_GRADIENT = 2.0
DEFAULT_TARGET_RATIO = 1.0
WINDOW_GAIN = 0.3
"""The exponent of a fast sample's gradient: under a third of a step per scrape interval (a change
shows in the window one or two intervals later — the requests it admits prefill first — so a whole
step would overshoot and oscillate)."""
WINDOW_SMOOTHING = 0.25
"""Weight of a new window in the exponentially weighted token latency the fast limit steers (about the
last four windows, two seconds at the default scrape interval). A request's TPOT is its mean over a
whole generation, so one window that caught a long prefill step (a cache miss: a tenth of a second
on an H100 13B) breaks no objective; cutting on it would queue requests for nothing at the knee."""
WINDOW_HEADROOM = 1.25
"""A fast limit grows no further than this × the batch running and waiting: a limit far above what
runs would let a burst through before any window could show its cost."""
WINDOW_CEILING_RATIO = 1.0 / MIN_GRADIENT
"""A window enters the steered latency at most at this × the set point (module docstring, "Stalls")."""
BIRTH_BATCH_RATIO = 2.0
"""No limit is born while the batch is under this × the floor (module docstring, "The first cut")."""


def _moved(mean: float | None, sample: float, weight: float) -> float:
    """An exponentially weighted mean after one more sample (the sample itself when there was none)."""
    return sample if mean is None else mean + weight * (sample - mean)


class TpotConcurrencyLimit:
    """The gradient limit of one replica (module docstring); `limit` is None until it is needed."""

    __slots__ = (
        "_cut_check",
        "_max",
        "_min",
        "_paced",
        "_samples",
        "_set_point_trim",
        "_steered_latency_s",
        "_target_s",
        "_tpot_s",
        "_update_every",
        "_window_latency_s",
        "_window_smoothing",
        "limit",
        "windowed",
    )

    def __init__(
        self,
        tpot_slo_s: float,
        *,
        min_limit: int,
        max_limit: int | None = None,
        update_every: int = DEFAULT_UPDATE_EVERY,
        target_ratio: float = DEFAULT_TARGET_RATIO,
        paced: bool = False,
        window_smoothing: float = WINDOW_SMOOTHING,
    ) -> None:
        if tpot_slo_s <= 0 or min_limit < 1 or update_every < 1:
            raise ValueError("tpot_slo_s, min_limit, update_every must be positive")
        if not 0 < target_ratio <= 1:
            raise ValueError("target_ratio must be in (0, 1]")
        if not 0 < window_smoothing <= 1:
            raise ValueError("window_smoothing must be in (0, 1]")
        self._paced = paced
        self._target_s = tpot_slo_s * target_ratio
        self._set_point_trim = SetPointTrim(tpot_slo_s, self._target_s)
        self._min = min_limit
        self._max = max_limit
        self._update_every = update_every
        self._samples = 0
        self._tpot_s: float | None = None
        self.limit: float | None = None
        self._window_latency_s: float | None = None
        """The windows' smoothed token latency as measured (what the futile-cut check judges)."""
        self._steered_latency_s: float | None = None
        """The same, each window held to `WINDOW_CEILING_RATIO` × the set point (what the limit steers)."""
        self._window_smoothing = window_smoothing
        self._cut_check = CutCheck(min_limit)
        self.windowed = False
        """True once a fast sample arrived: finished requests' TPOTs no longer move the limit."""

    @property
    def set_point_s(self) -> float:
        """The token latency the fast limit steers to (seconds; trimmed by finished requests)."""
        return self._target_s

    @property
    def steered_set_point_s(self) -> float:
        """The token latency the fast limit steers to now: the set point, or the reachable one while
        its cuts were found futile (`gateway.upstream.cut_check`)."""
        return self._cut_check.set_point_s(self._target_s)

    @property
    def held_near_floor(self) -> bool:
        """The limit within twice its floor (a probe included) while the smoothed token latency is over
        what it steers to: the objective out of reach even at the smallest batches the cap allows."""
        latency_s, limit = self._steered_latency_s or 0.0, self.limit or math.inf
        return limit <= PROBE_FACTOR * self._min and latency_s > self.steered_set_point_s

    @property
    def cap(self) -> int | None:
        """The limit as a whole number of requests, None while there is none."""
        return None if self.limit is None else max(self._min, math.floor(self.limit))

    def reset(self) -> None:
        """Forget the limit and the samples (no limit until the objective breaks again)."""
        self.limit = self._tpot_s = None
        self._samples = 0
        self._window_latency_s = self._steered_latency_s = None
        self._cut_check = CutCheck(self._min)
        self.windowed = False

    def observe_window(self, latency_s: float, batch: float) -> None:
        """One fast sample: the engine's mean token latency over a scrape interval, at `batch` sequences
        running and waiting there (module docstring, "Fast samples")."""
        if not math.isfinite(latency_s) or latency_s <= 0:
            return
        self.windowed = True
        weight = self._window_smoothing
        smoothed = self._window_latency_s = _moved(self._window_latency_s, latency_s, weight)
        check = self._cut_check
        futile = check.window(smoothed, batch, self._target_s, self.limit)
        steer_s = check.set_point_s(self._target_s)
        window_s = min(latency_s, WINDOW_CEILING_RATIO * steer_s)
        steered = self._steered_latency_s = _moved(self._steered_latency_s, window_s, weight)
        gradient = min(MAX_PACED_GRADIENT, max(MIN_GRADIENT, steer_s / steered))
        base = max(batch, float(self._min))
        if self.limit is None:
            if gradient >= 1.0 or batch < BIRTH_BATCH_RATIO * self._min:
                return
            new = base * gradient**WINDOW_GAIN
        elif gradient < 1.0:
            new = min(self.limit, base * gradient**WINDOW_GAIN)
        else:
            new = min(max(self.limit, base * gradient**WINDOW_GAIN), WINDOW_HEADROOM * base)
        if check.futile_batch is not None and (futile or gradient >= 1.0):
            # the futile cuts undone and not redone; the batch does not move the latency: grow with it
            new = max(new, check.futile_batch, WINDOW_HEADROOM * base)
        if check.probe_level is not None:
            new = check.probe_level
        self.limit = max(float(self._min), new)  # engine-wide: a per-instance configured cap applies apart

    def observe(self, tpot_s: float, inflight: int, share: float = 1.0) -> None:
        """One finished request's TPOT, with `inflight` requests on the replica now. Once fast samples
        arrive it no longer moves the limit; it trims the fast limit's set point instead (module
        docstring, "The set point's trim"), at the pace `share` (this instance's share of the replica's
        requests) sets (`gateway.upstream.set_point_trim`, "Several instances")."""
        if not math.isfinite(tpot_s) or tpot_s <= 0:
            return
        if self.windowed:
            trim = self._set_point_trim
            self._target_s = trim.trimmed(tpot_s, self._target_s, self._steered_latency_s, share)
            return
        self._tpot_s = _moved(self._tpot_s, tpot_s, TPOT_WEIGHT)
        self._samples += 1
        if self._samples % self._update_every:
            return
        ceiling = MAX_PACED_GRADIENT if self._paced else 1.0  # the first cut needs gradient < 1 anyway
        gradient = min(ceiling, max(MIN_GRADIENT, self._target_s / self._tpot_s))
        if self.limit is None:
            if gradient >= 1.0:
                return
            new = max(inflight, self._min) * gradient
        elif not self._paced:
            new = self.limit * gradient + (math.sqrt(self.limit) if gradient >= 1.0 else 0.0)
        else:
            share = min(1.0, self._update_every / max(inflight, 1))
            new = self.limit * gradient**share
            if gradient >= 1.0:
                new = min(new + share * math.sqrt(self.limit), max(self.limit, 2.0 * inflight))
        if self._max is not None:
            new = min(new, float(self._max))
        self.limit = max(float(self._min), new)
