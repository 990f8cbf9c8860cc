"""Arrival processes: when each request is sent, as offsets in seconds from the run's start.

Open loop (the client does not wait for answers, so an overloaded server cannot slow the offered load):
- `Poisson(rate)`: exponential gaps with mean 1/rate.
- `Gamma(rate, burstiness)`: gamma gaps with shape = burstiness and mean 1/rate (vLLM's `--burstiness`):
  1 is Poisson, < 1 is burstier (clustered arrivals, long pauses), > 1 is smoother.
- `Constant(rate)`: one request every 1/rate seconds.
- `StepSpike(rate, factor, start, duration)`: Poisson at `rate`, at `rate × factor` during the spike;
  generated exactly by time rescaling (unit-rate exponentials mapped through the inverse of the
  integrated rate), so the count in any interval is Poisson with the right mean.
- `TraceTimes(offsets)`: the timestamps of a trace file.

Closed loop: `ClosedLoop(concurrency)` — C virtual users, each sends its next request when the previous
answer ended. It is not an offset stream; the runner drives it.

Every process is deterministic under the `random.Random` it is given.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Poisson:
    rate_per_s: float

    def offsets_s(self, rng: random.Random) -> Iterator[float]:
        _positive(self.rate_per_s, "rate")
        now_s = 0.0
        while True:
            now_s += rng.expovariate(self.rate_per_s)
            yield now_s

    @property
    def offered_rate_per_s(self) -> float:
        return self.rate_per_s


@dataclass(frozen=True, slots=True)
class Gamma:
    rate_per_s: float
    burstiness: float = 1.0

    def offsets_s(self, rng: random.Random) -> Iterator[float]:
        _positive(self.rate_per_s, "rate")
        _positive(self.burstiness, "burstiness")
        scale_s = 1.0 / (self.rate_per_s * self.burstiness)
        now_s = 0.0
        while True:
            now_s += rng.gammavariate(self.burstiness, scale_s)
            yield now_s

    @property
    def offered_rate_per_s(self) -> float:
        return self.rate_per_s


@dataclass(frozen=True, slots=True)
class Constant:
    rate_per_s: float

    def offsets_s(self, rng: random.Random) -> Iterator[float]:
        _positive(self.rate_per_s, "rate")
        return (k / self.rate_per_s for k in itertools.count(1))

    @property
    def offered_rate_per_s(self) -> float:
        return self.rate_per_s


@dataclass(frozen=True, slots=True)
class StepSpike:
    rate_per_s: float
    factor: float = 3.0
    start_s: float = 10.0
    duration_s: float = 10.0

    def rate_at(self, t_s: float) -> float:
        in_spike = self.start_s <= t_s < self.start_s + self.duration_s
        return self.rate_per_s * self.factor if in_spike else self.rate_per_s

    def offsets_s(self, rng: random.Random) -> Iterator[float]:
        _positive(self.rate_per_s, "rate")
        _positive(self.factor, "spike factor")
        work = 0.0  # integrated rate Λ(t): expected arrivals by time t
        while True:
            work += rng.expovariate(1.0)
            yield self._inverse_integrated_rate(work)

    def _inverse_integrated_rate(self, work: float) -> float:
        base, spike = self.rate_per_s, self.rate_per_s * self.factor
        before = base * self.start_s
        if work <= before:
            return work / base
        during = spike * self.duration_s
        if work <= before + during:
            return self.start_s + (work - before) / spike
        return self.start_s + self.duration_s + (work - before - during) / base

    @property
    def offered_rate_per_s(self) -> float:
        return self.rate_per_s


@dataclass(frozen=True, slots=True)
class TraceTimes:
    times_s: tuple[float, ...]

    def offsets_s(self, rng: random.Random) -> Iterator[float]:
        return iter(self.times_s)

    @property
    def offered_rate_per_s(self) -> float | None:
        if len(self.times_s) < 2 or self.times_s[-1] <= self.times_s[0]:
            return None
        return (len(self.times_s) - 1) / (self.times_s[-1] - self.times_s[0])


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


OpenLoop = Poisson | Gamma | Constant | StepSpike | TraceTimes
Arrivals = OpenLoop | ClosedLoop

ARRIVAL_KINDS = ("poisson", "gamma", "constant", "step", "closed", "trace")


def make_arrivals(
    kind: str,
    level: float,
    *,
    burstiness: float = 1.0,
    spike_factor: float = 3.0,
    spike_start_s: float = 10.0,
    spike_duration_s: float = 10.0,
    trace_times_s: Sequence[float] = (),
) -> Arrivals:
    """Build the named process; `level` is the rate (req/s) for open loop, the concurrency for closed."""
    if kind == "poisson":
        return Poisson(level)
    if kind == "gamma":
        return Gamma(level, burstiness)
    if kind == "constant":
        return Constant(level)
    if kind == "step":
        return StepSpike(level, spike_factor, spike_start_s, spike_duration_s)
    if kind == "closed":
        return ClosedLoop(int(level))
    if kind == "trace":
        return TraceTimes(tuple(trace_times_s))
    raise ValueError(f"unknown arrival process {kind!r}; known: {', '.join(ARRIVAL_KINDS)}")


def describe(arrivals: Arrivals) -> dict[str, object]:
    """A JSON-friendly description for reports."""
    if isinstance(arrivals, ClosedLoop):
        return {"kind": "closed", "concurrency": arrivals.concurrency}
    if isinstance(arrivals, TraceTimes):
        return {"kind": "trace", "requests": len(arrivals.times_s)}
    kind = {Poisson: "poisson", Gamma: "gamma", Constant: "constant", StepSpike: "step"}[type(arrivals)]
    fields = {k: getattr(arrivals, k) for k in arrivals.__dataclass_fields__}
    return {"kind": kind, **fields}


def _positive(value: float, what: str) -> None:
    if value <= 0:
        raise ValueError(f"{what} must be > 0, got {value}")
