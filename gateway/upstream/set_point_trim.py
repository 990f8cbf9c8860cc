"""The fast learned cap's set point, trimmed by what finished requests' TPOTs say.

With fast samples the limit (`gateway.upstream.tpot_limit`) holds the engine's *mean* token latency at
its set point, but what the objective judges is each request's own TPOT, which scatters around that
mean by an amount the workload decides (long prompts' prefill chunks land on some requests' steps more
than on others'; a token-weighted mean and a per-request one differ). So the finished requests' TPOTs
trim the set point: every `ATTAINMENT_EVERY` finished requests, with q the `ATTAINMENT_QUANTILE` of the
last `ATTAINMENT_SAMPLES`,

    set point × clamp(ATTAINMENT_RATIO × objective / q, 0.8, 1.25)^0.5

kept within `TRIM_BOUNDS` of the objective (up to where it started, when that is higher). It starts at
`target_ratio` × the objective and moves at the pace of finished requests (slow), while the limit
follows the engine's latency (fast): a cascade.
It moves up only while the steered latency is at least `TRIM_UP_BINDING` × the set point — the limit
steering the latency at it, so the finished TPOTs say what the set point gives; below the knee (no
limit, or one not reached) they say only that the load is light, and trimmed up on them the set point
wound up to the objective itself, from where a step in the load is admitted up to the objective (the
trace and the runs: docs/bench-log/2026-12-05-overload-onset.md, "The trim's windup"). Down it always
moves: TPOTs over the objective are a reason whatever the limit did.

Several instances: each gateway instance hears only of its own requests' TPOTs, a share `s` of the
replica's (`ReplicaCost.own_share`: its in-flight ÷ the engine's batch, smoothed). Counted in its own
requests, the trim of one of three instances moved at a third of the pace of one instance alone: at
1.5× the knee the set point sat at its start through the whole run, where one instance had trimmed it
to its ceiling halfway through, and the caps stayed lower (docs/bench-log/2026-12-06-trim-pace.md).
So the counts scale with the share: the quantile of the last max(`MIN_ATTAINMENT_SAMPLES`,
round(s × `ATTAINMENT_SAMPLES`)), every max(`MIN_ATTAINMENT_EVERY`, round(s × `ATTAINMENT_EVERY`)):
the pace counted in the replica's finished requests is one instance's, the quantile noisier.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

ATTAINMENT_QUANTILE = 0.95
"""The share of finished requests whose TPOT the set point is trimmed to keep within the objective
(`ATTAINMENT_RATIO` × `slo.tpot_s`): the trim is what the admitted requests' own TPOTs say."""
ATTAINMENT_RATIO = 0.95
ATTAINMENT_SAMPLES = 64
"""Finished requests the quantile is taken over (the latest of this replica's)."""
ATTAINMENT_EVERY = 16
"""The set point is trimmed every this many finished requests, by at most × [0.8, 1.25]^0.5."""
MIN_ATTAINMENT_SAMPLES = 16
"""The fewest finished requests a trim takes its quantile over, whatever this instance's share."""
MIN_ATTAINMENT_EVERY = 4
"""The fewest finished requests between two trims, whatever this instance's share."""
TRIM_BOUNDS = (0.5, 0.9)
"""The set point stays within these shares of the objective. Why not up to the objective itself: the
trim moves on requests admitted a generation ago, so when a cohort of requests ends together (the batch
halves, the limit grows back at once) the limit steers at a set point those earlier requests earned;
at the objective, with requests scattered around the mean, that cost a third of the admitted requests
in the stretch that followed (docs/bench-log/2026-12-05-cold-onset.md)."""
TRIM_UP_BINDING = 0.9
"""The set point is trimmed up only while the steered token latency is at least this share of it."""


class SetPointTrim:
    """The trim of one replica's set point (module docstring)."""

    __slots__ = ("_ceiling_s", "_recent_tpots", "_since_trim", "_slo_s")

    def __init__(self, tpot_slo_s: float, start_s: float) -> None:
        self._slo_s = tpot_slo_s
        self._ceiling_s = max(TRIM_BOUNDS[1] * tpot_slo_s, start_s)  # a set point started higher stays
        self._recent_tpots: deque[float] = deque(maxlen=ATTAINMENT_SAMPLES)
        self._since_trim = 0

    def trimmed(
        self, tpot_s: float, set_point_s: float, latency_s: float | None, share: float = 1.0
    ) -> float:
        """The set point after one finished request's TPOT `tpot_s`, with `latency_s` the smoothed token
        latency the limit steers (None before the first window) and `share` (0 < share ≤ 1) this
        instance's share of the replica's requests (module docstring, "Several instances")."""
        recent = self._recent_tpots
        recent.append(tpot_s)
        self._since_trim += 1
        samples = max(MIN_ATTAINMENT_SAMPLES, round(ATTAINMENT_SAMPLES * share))
        every = max(MIN_ATTAINMENT_EVERY, round(ATTAINMENT_EVERY * share))
        if len(recent) < samples or self._since_trim < every:
            return set_point_s
        self._since_trim = 0
        ordered = sorted(itertools.islice(recent, len(recent) - samples, None))
        quantile_s = ordered[min(len(ordered) - 1, int(ATTAINMENT_QUANTILE * len(ordered)))]
        step = math.sqrt(min(1.25, max(0.8, ATTAINMENT_RATIO * self._slo_s / quantile_s)))
        if step > 1.0 and (latency_s is None or latency_s < TRIM_UP_BINDING * set_point_s):
            return set_point_s  # the latency is not held at the set point: its requests say nothing of it
        return min(self._ceiling_s, max(TRIM_BOUNDS[0] * self._slo_s, set_point_s * step))
