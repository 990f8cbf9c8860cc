"""Whether the learned cap's cuts lower the engine's token latency: the check that stops futile cuts.

The fast limit (`gateway.upstream.tpot_limit`) cuts while the smoothed token latency is over its set
point. That is right when a smaller batch makes tokens faster. It is wrong when the latency does not
fall with the batch: an objective below what the engine does at any batch (a mis-set `slo.tpot_s`, a
slow model, a fixed-delay engine). There each cut follows the draining batch down, the limit reaches
its floor (`min_cap_per_replica`), the replica runs a handful of requests while the rest wait in the
queue until they time out — for a latency no batch would reach.

So a run of cuts is checked by what it did. The first cut of a run (a window over the set point after
one at or under it) opens a check at the batch it cut from and the smoothed latency then, (B0, l0). A
window at or under the set point closes it (the cuts reached it). Once the batch has stayed at
`CHECK_DEPTH` × B0 or below for `SETTLE_WINDOWS` windows in a row, at (B1, l1), the line through the
two points says what the latency would be with no batch at all:

    slope  = max(0, (l0 − l1) / (B0 − B1))
    floor  = l1 − slope × B1

When `floor` is at or over the set point, no cut can reach it (for a latency convex in the batch, as a
decode step's is, the true floor lies above the line, so the verdict errs toward cutting); when the
latency also stayed within `FLAT_SHARE` of l0, the cuts were futile. Then the set point the limit
steers to becomes `FUTILE_MARGIN` × l0 (`reachable_s`), and the limit goes back to B0: the cap stands
where it found the load and still holds a further rise in it. The verdict holds until the smoothed
latency falls under the set point (the engine got faster, the load changed), which clears it, as does
a later run of cuts whose floor is under the set point. When the floor is under the set point the cuts
pay and the check closes; the next run of cuts opens another.

From the floor. Cuts that reach the floor without a drain have nothing to judge: when the objective
breaks on the first requests of a cold start, the cuts follow the batch down from where the limit is
born (twice `min_cap_per_replica`) to the floor while it builds, before any run could settle.
So a limit that has sat at the floor for `PROBE_AFTER_WINDOWS` windows in a row, with the batch filling
it and the latency over the set point, is probed: it is raised to `PROBE_FACTOR` × the floor and held
there (`probe_level`) until the batch has filled it for `SETTLE_WINDOWS` windows. A latency within
`FLAT_SHARE` of the floor's is a floor: the same verdict (steer to 1.1 × the higher of the two, the
limit no lower than the probe's). One that rose ends the probe — the cuts take the limit back down — and
so does a probe the demand does not fill within `PROBE_MAX_WINDOWS`; each doubles the wait for the next
(up to × `PROBE_BACKOFF_MAX`, 64 s at the default scrape interval), so where the batch does cost
latency, probing costs twice the floor for a few windows, less and less often.

While a verdict holds and the latency is under what it steers to, the limit grows to `WINDOW_HEADROOM`
× the batch each window (the batch does not move the latency: the gradient's small steps would take
minutes to reach the demand, and at a batch under about 35 would never admit one more).

Why the latency must also have stayed flat: on a prefill-heavy workload the token latency follows the
prefill tokens each step carries, which the dispatch rate sets, not the batch. A cohort of requests
ending together halves the batch while the prefill of the next wave keeps the latency high or
raises it; judged on the line alone, such a drain read as futile on one replica in two of four cold
runs at 1.5× the knee (docs/bench-log/2026-12-05-futile-cuts.md), which then steered at 1.1 × a
prefill spike (~200 ms against an 80 ms set point) and collapsed the run's goodput. A latency that
does not move while the batch halves is the signature of a floor; one that moves is not.

Why half the batch (`CHECK_DEPTH`): the floor's error is the latencies' noise × B1 / (B0 − B1), once at
a half, three times at three quarters. Judged sooner, a prefill burst in the smoothed latency would pass
for a futile cut more often; later, the futile cut costs the replica more of its batch while it drains.
Judged only on fast samples (the engine's token latency per scrape window): a finished request's TPOT
describes the batch of a generation ago, so at the moment the batch halves it still shows the batch
before the cut, and every cut would look futile.
"""

from __future__ import annotations

CHECK_DEPTH = 0.5
"""A run of cuts is judged once the batch is at or under this share of the batch it was cut from."""
SETTLE_WINDOWS = 4
"""Windows in a row the batch stays at or under `CHECK_DEPTH` × B0 before the latency there is read: the
smoothed latency's time constant (weight 0.25), so l1 describes the smaller batch and not a spike
before it (a cohort of requests ending together halves the batch in a window or two)."""
FLAT_SHARE = 0.1
"""A futile run also left the latency within this share of l0: a latency that moved more while the batch
halved moved for another reason (prefill), and says nothing of the batch."""
FUTILE_MARGIN = 1.1
"""After a futile verdict the limit steers to this × the latency where the cuts began: over it, and no
further cut is asked of a latency the cut did not change."""
PROBE_AFTER_WINDOWS = 8
"""Windows in a row at the floor, the batch filling it and the latency over the set point, before the
first probe; each failed or unfilled probe doubles the wait, up to × `PROBE_BACKOFF_MAX`."""
PROBE_BACKOFF_MAX = 16
PROBE_FACTOR = 2.0
"""A probe raises the limit from the floor to this × the floor."""
PROBE_FILL = 0.9
"""A probe is read once the batch has stayed at or over this share of its level `SETTLE_WINDOWS` windows."""
PROBE_MAX_WINDOWS = 16
"""A probe whose batch has not filled and settled within this many windows ends unread."""


class CutCheck:
    """One replica's check of its fast limit's cuts (module docstring)."""

    __slots__ = (
        "_backoff",
        "_floor",
        "_floor_windows",
        "_probe_windows",
        "_settled",
        "_start_batch",
        "_start_latency_s",
        "futile_batch",
        "probe_level",
        "reachable_s",
    )

    def __init__(self, floor: int = 1) -> None:
        self._floor = float(floor)
        self._start_batch: float | None = None
        self._start_latency_s = 0.0
        self._settled = 0
        self._floor_windows = 0
        self._probe_windows = 0
        self._backoff = 1
        self.probe_level: float | None = None
        """While a probe runs: the limit it holds (module docstring, "From the floor")."""
        self.reachable_s: float | None = None
        """The set point a futile verdict found reachable (None: no verdict holds)."""
        self.futile_batch: float | None = None
        """The batch the futile cuts began at (set with `reachable_s`, for the limit to return to)."""

    @property
    def open(self) -> bool:
        """A run of cuts is being watched."""
        return self._start_batch is not None

    def set_point_s(self, set_point_s: float) -> float:
        """What the limit steers to: the set point, or the reachable one while a futile verdict holds."""
        reachable = self.reachable_s
        return set_point_s if reachable is None else max(set_point_s, reachable)

    def window(self, latency_s: float, batch: float, set_point_s: float, limit: float | None = None) -> bool:
        """One fast sample, before the limit moves on it: `latency_s` the smoothed token latency,
        `batch` the engine's running and waiting, `set_point_s` the limit's own (trimmed) set point,
        `limit` the limit before it. Returns True when it finds the cuts futile (the limit then goes
        back to `futile_batch`); while `probe_level` is set the limit holds it."""
        if latency_s < set_point_s:
            self.reachable_s = self.futile_batch = self.probe_level = None  # the objective is in reach
            self._floor_windows, self._backoff = 0, 1
        if self.probe_level is not None:
            return self._probe(self.probe_level, latency_s, batch)
        steer_s = self.set_point_s(set_point_s)
        if latency_s <= steer_s:
            self._start_batch = None  # no cut in this window: the run, if any, reached its set point
            self._floor_windows = 0
            return False
        if self._watch_floor(batch, limit):
            return False
        start = self._start_batch
        if start is None:
            if batch > 0:
                self._start_batch, self._start_latency_s, self._settled = batch, latency_s, 0
            return False
        if batch > CHECK_DEPTH * start:
            self._settled = 0
            return False
        self._settled += 1
        if self._settled < SETTLE_WINDOWS:
            return False
        self._start_batch = None
        slope = max(0.0, (self._start_latency_s - latency_s) / (start - batch))
        floor_s = latency_s - slope * batch
        if floor_s < set_point_s:
            self.reachable_s = self.futile_batch = None  # the batch decides after all
        if floor_s < steer_s or abs(latency_s - self._start_latency_s) > FLAT_SHARE * self._start_latency_s:
            return False
        self.reachable_s = FUTILE_MARGIN * self._start_latency_s
        self.futile_batch = start
        return True

    def _watch_floor(self, batch: float, limit: float | None) -> bool:
        """A window over the set point: counted while the limit sits at the floor and the batch fills
        it; True when it starts a probe."""
        if limit is None or limit > self._floor or batch < PROBE_FILL * self._floor:
            self._floor_windows = 0
            return False
        self._floor_windows += 1
        if self._floor_windows < PROBE_AFTER_WINDOWS * self._backoff:
            return False
        self.probe_level = PROBE_FACTOR * self._floor
        self._start_batch = None
        self._probe_windows = self._settled = 0
        return True

    def _probe(self, level: float, latency_s: float, batch: float) -> bool:
        """A window while a probe holds the limit at `level` (module docstring, "From the floor")."""
        self._probe_windows += 1
        if self._probe_windows == 1:
            self._start_latency_s = latency_s  # l0: the latency at the floor, read as the probe starts
        if batch >= PROBE_FILL * level:
            self._settled += 1
        else:
            self._settled = 0
        settled = self._settled >= SETTLE_WINDOWS
        if not settled and self._probe_windows < PROBE_MAX_WINDOWS:
            return False
        self.probe_level = None  # read, or not filled: too little demand to tell
        self._floor_windows = 0
        flat = abs(latency_s - self._start_latency_s) <= FLAT_SHARE * self._start_latency_s
        if settled and flat:
            self.reachable_s = FUTILE_MARGIN * max(latency_s, self._start_latency_s)
            self.futile_batch = level
            self._backoff = 1
            return True
        self._backoff = min(PROBE_BACKOFF_MAX, 2 * self._backoff)  # the batch costs, or no answer
        return False
