"""The knee of a fleet and workload: the highest offered rate at which at least `slo_ratio` of the
requests meet the SLO. Pure search logic; `measure(rate)` runs one probe and returns the share of its
requests that met the SLO (`bench sweep` runs each on a fresh fleet with no admission).

The search assumes the share falls as the rate rises, and spends one probe per step:

1. the `start` rate;
2. if it met the ratio, doubling until a rate misses it — or until `max_rate` met it too (then the knee
   is `max_rate`, reported as a bound: the fleet met the SLO at every probed rate); if it missed,
   halving until a rate meets it — or until `min_rate` missed too (then there is no knee);
3. bisection between the highest rate that met the ratio and the lowest that missed it, at the
   midpoint, until (missed − met) ≤ `precision` × met. The knee is the highest rate that met it.

Once the bracket is found every probe lies inside it, so a noisy probe (a miss where a higher rate
would meet) only narrows it: the knee is always a rate measured to meet the ratio, below every rate
measured to miss it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_SLO_RATIO = 0.95
DEFAULT_PRECISION = 0.1
DEFAULT_RANGE = 256.0
"""Without `max_rate` / `min_rate`, the search goes at most this factor above or below `start`."""

Measure = Callable[[float], float]
OnProbe = Callable[["Probe"], None]


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured rate: the share of its requests within the SLO, and the step that chose it
    (`start`, `double`, `halve` or `bisect`)."""

    rate: float
    met_ratio: float
    meets: bool
    step: str


@dataclass(frozen=True, slots=True)
class KneeSearch:
    """The outcome: `knee` (None: no probed rate met the ratio), every probe in order, and how the
    search ended (`ended`: `bisected`, `max_rate` or `no_rate`)."""

    knee: float | None
    probes: tuple[Probe, ...]
    ended: str

    @property
    def lowest_miss(self) -> float | None:
        """The lowest probed rate that missed the ratio (the knee's upper bracket), None if none did."""
        missed = [p.rate for p in self.probes if not p.meets]
        return min(missed) if missed else None


def find_knee(
    measure: Measure,
    *,
    start: float,
    slo_ratio: float = DEFAULT_SLO_RATIO,
    precision: float = DEFAULT_PRECISION,
    max_rate: float | None = None,
    min_rate: float | None = None,
    on_probe: OnProbe | None = None,
) -> KneeSearch:
    """Search the knee (module docstring); `on_probe` is told of each probe as it is measured."""
    top = max_rate if max_rate is not None else start * DEFAULT_RANGE
    bottom = min_rate if min_rate is not None else start / DEFAULT_RANGE
    if not 0 < bottom <= start <= top:
        raise ValueError(f"the knee search needs 0 < min rate {bottom:g} ≤ start {start:g} ≤ max {top:g}")
    if not 0 < slo_ratio <= 1:
        raise ValueError(f"the knee's SLO ratio must be in (0, 1], got {slo_ratio:g}")
    if precision <= 0:
        raise ValueError(f"the knee's precision must be > 0, got {precision:g}")
    probes: list[Probe] = []

    def probe(rate: float, step: str) -> bool:
        ratio = measure(rate)
        found = Probe(rate, ratio, ratio >= slo_ratio, step)
        probes.append(found)
        if on_probe is not None:
            on_probe(found)
        return found.meets

    rate = start
    if probe(rate, "start"):
        while True:
            if rate >= top:
                return KneeSearch(rate, tuple(probes), "max_rate")
            low, rate = rate, min(rate * 2, top)
            if not probe(rate, "double"):
                high = rate
                break
    else:
        while True:
            if rate <= bottom:
                return KneeSearch(None, tuple(probes), "no_rate")
            high, rate = rate, max(rate / 2, bottom)
            if probe(rate, "halve"):
                low = rate
                break
    while high - low > precision * low:
        mid = (low + high) / 2
        if probe(mid, "bisect"):
            low = mid
        else:
            high = mid
    return KneeSearch(low, tuple(probes), "bisected")
