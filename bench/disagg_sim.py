"""A disaggregated pool run on the mock's physics core in simulated time: no servers, no wall clock.

    simulate_disagg(profile, link, PoolShape(P, D), DisaggLoad(λ, ī, ō, requests, seed)) → [RequestTiming]

Each request arrives at a Poisson time (seeded), goes to the prefill replica with the fewest requests
outstanding (ties: the lowest index) as a one-token prefill leg, and when that leg's token is emitted its
decode leg goes, at that same instant, to the decode replica with the fewest requests outstanding, with
`kv_transfer_s = link.transfer_s(ī, kv_bytes_per_token)` (the core holds its KV from admission and
schedules it once the transfer has landed, as `mock_engine.disagg_role` does). This is the physics of
the disaggregation benchmark (`bench compare --disagg P:D`) without the gateway's and HTTP's wall-clock
costs. Every prompt has exactly ī tokens and every answer ō; prompts share no prefix (no cache hits).

Per request: TTFT = first decode token − arrival; TPOT = (last − first decode token) / (ō − 1), the
benchmark's definitions (`bench.stats.tpot_s`). The event loop advances every core to the earliest of the
next arrival and the cores' next step ends, so the cost is O(steps × running), a few seconds of CPU for
a few thousand requests. Raises `ValueError` for an empty pool or a request larger than a core's KV.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from mock_engine.core import EngineRequest, TokenEvent
from mock_engine.physics.engine import PhysicsCore
from mock_engine.physics.kv_link import KvLink
from mock_engine.physics.profile import EngineProfile


@dataclass(frozen=True, slots=True)
class PoolShape:
    """P prefill and D decode replicas, one GPU each."""

    prefill_replicas: int
    decode_replicas: int


@dataclass(frozen=True, slots=True)
class DisaggLoad:
    """Poisson arrivals at `arrival_rate_per_s` of `requests` requests, ī tokens in and ō out each."""

    arrival_rate_per_s: float
    input_tokens: int
    output_tokens: int
    requests: int
    seed: int = 29


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One finished request: simulated arrival, TTFT and TPOT (seconds; TPOT None for ō = 1)."""

    arrival_s: float
    ttft_s: float
    tpot_s: float | None


class _Replicas:
    """Cores of one role, routed to the one with the fewest outstanding requests."""

    def __init__(self, profile: EngineProfile, count: int) -> None:
        if count < 1:
            raise ValueError("a disaggregated pool needs at least one prefill and one decode replica")
        self.cores = [PhysicsCore(profile) for _ in range(count)]
        self.outstanding = [0] * count

    def submit(self, request: EngineRequest) -> None:
        index = min(range(len(self.cores)), key=self.outstanding.__getitem__)
        self.outstanding[index] += 1
        self.cores[index].submit(request)

    def next_event_s(self) -> float:
        ends = [end for core in self.cores if (end := core.next_event_s()) is not None]
        return min(ends, default=math.inf)

    def advance(self, now_s: float) -> list[TokenEvent]:
        """Every core's tokens up to `now_s`; a finished request stops counting as outstanding."""
        events: list[TokenEvent] = []
        for index, core in enumerate(self.cores):
            emitted = core.advance(now_s)
            self.outstanding[index] -= sum(1 for event in emitted if event.finished)
            events.extend(emitted)
        return events


def poisson_arrivals_s(load: DisaggLoad) -> list[float]:
    """`load.requests` arrival times with exponential gaps of mean 1 / λ, from `random.Random(seed)`."""
    rng = random.Random(load.seed)
    now_s, times = 0.0, []
    for _ in range(load.requests):
        now_s += rng.expovariate(load.arrival_rate_per_s)
        times.append(now_s)
    return times


def simulate_disagg(
    profile: EngineProfile, link: KvLink, shape: PoolShape, load: DisaggLoad
) -> list[RequestTiming]:
    """Run every request to its last token (module docstring); timings in arrival order."""
    prefill = _Replicas(profile, shape.prefill_replicas)
    decode = _Replicas(profile, shape.decode_replicas)
    transfer_s = link.transfer_s(load.input_tokens, profile.kv_bytes_per_token)
    arrivals = poisson_arrivals_s(load)
    first_s: dict[int, float] = {}
    timings: dict[int, RequestTiming] = {}
    next_arrival = 0
    while len(timings) < load.requests:
        arrival_s = arrivals[next_arrival] if next_arrival < len(arrivals) else math.inf
        now_s = min(arrival_s, prefill.next_event_s(), decode.next_event_s())
        if math.isinf(now_s):  # pragma: no cover - every request in flight has a next step
            raise RuntimeError("simulation stalled with requests unfinished")
        for event in prefill.advance(now_s):
            decode.submit(
                EngineRequest(event.request_id, "", load.input_tokens, load.output_tokens, now_s, transfer_s)
            )
        for event in decode.advance(now_s):
            index = int(event.request_id)
            if event.index == 0:
                first_s[index] = event.time_s
            if event.finished:
                first = first_s.pop(index)
                tpot = (event.time_s - first) / (load.output_tokens - 1) if load.output_tokens > 1 else None
                timings[index] = RequestTiming(arrivals[index], first - arrivals[index], tpot)
        if arrival_s <= now_s:
            prefill.submit(EngineRequest(str(next_arrival), "", load.input_tokens, 1, arrival_s))
            next_arrival += 1
    return [timings[i] for i in range(load.requests)]
