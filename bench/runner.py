"""Drive one load against one target: arrivals × workload → requests → samples.

Open loop: request k is sent at its arrival offset whatever happened to the others. Closed loop: C
workers, each sending its next request when its previous answer ended. A run stops after `requests`
requests or when `duration_s` has passed (no new sends after it; requests in flight are awaited).

Warm-up: the first `warmup_requests` requests, and every request scheduled before `warmup_s`, are sent
but marked `warmup` and left out of every summary; the engines' prefix-cache counters are read when the
first measured request is sent, so the hit ratio also covers the measured window only.

`on_measured(elapsed_s)`, when given, is called once, as the first measured request is sent (a fault
schedule's clock starts there).

Sessions: requests of one `session_id` are sent in order and never overlap (turn k+1 waits for the answer
to turn k, as a person in a chat would); the wait shows up as the sample's `lag_s`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from bench.arrivals import Arrivals, ClosedLoop
from bench.client import Client
from bench.engine_metrics import EngineSampler
from bench.progress import Progress
from bench.sample import Sample
from bench.workload import RequestSpec

PickUrl = Callable[[RequestSpec], str]
OnMeasured = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    arrivals: Arrivals
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests is None and self.duration_s is None:
            raise ValueError("a load plan needs a request count or a duration")

    def is_warmup(self, index: int, scheduled_s: float) -> bool:
        return index < self.warmup_requests or scheduled_s < self.warmup_s


@dataclass(slots=True)
class RunRecord:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def measured(self) -> list[Sample]:
        return [s for s in self.samples if not s.warmup]


class _Run:
    def __init__(
        self,
        plan: LoadPlan,
        specs: Iterator[RequestSpec],
        client: Client,
        pick_url: PickUrl,
        *,
        sampler: EngineSampler | None,
        progress: Progress | None,
        label_replicas: bool = False,
        on_measured: OnMeasured | None = None,
    ) -> None:
        self.label_replicas = label_replicas
        self.on_measured = on_measured
        self.measured_started = False
        self.plan = plan
        self.specs = specs
        self.client = client
        self.pick_url = pick_url
        self.sampler = sampler
        self.progress = progress
        self.record = RunRecord()
        self.start = time.perf_counter()
        self._sessions: dict[str, asyncio.Lock] = {}
        self.baseline_taken = False
        self.baseline_task: asyncio.Task[None] | None = None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def _more(self, index: int, scheduled_s: float) -> bool:
        if self.plan.requests is not None and index >= self.plan.requests:
            return False
        return self.plan.duration_s is None or scheduled_s < self.plan.duration_s

    async def one(self, index: int, scheduled_s: float, spec: RequestSpec) -> None:
        warmup = self.plan.is_warmup(index, scheduled_s)
        if not warmup and not self.measured_started:
            self.measured_started = True
            if self.on_measured is not None:
                self.on_measured(self.elapsed_s())
        if not warmup and not self.baseline_taken and self.sampler is not None:
            self.baseline_taken = True
            self.baseline_task = asyncio.create_task(self.sampler.baseline())
        lock = self._sessions.setdefault(spec.session_id, asyncio.Lock()) if spec.session_id else None
        if self.progress is not None:
            self.progress.sent()
        if lock is None:
            url = self.pick_url(spec)
            sample = await self.client.send(url, spec, index, scheduled_s, self.start)
        else:
            async with lock:
                url = self.pick_url(spec)
                sample = await self.client.send(url, spec, index, scheduled_s, self.start)
        if warmup or (self.label_replicas and sample.replica is None):
            replica = sample.replica or (url.split("://", 1)[-1].rstrip("/") if self.label_replicas else None)
            sample = replace(sample, warmup=warmup, replica=replica)
        self.record.samples.append(sample)
        if self.progress is not None:
            self.progress.done(sample)

    async def open_loop(self, offsets: Iterator[float]) -> None:
        tasks: list[asyncio.Task[None]] = []
        for index, (offset_s, spec) in enumerate(zip(offsets, self.specs, strict=False)):
            if not self._more(index, offset_s):
                break
            delay_s = offset_s - self.elapsed_s()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            tasks.append(asyncio.create_task(self.one(index, offset_s, spec)))
        await asyncio.gather(*tasks)

    async def closed_loop(self, concurrency: int) -> None:
        counter = itertools.count()

        async def worker() -> None:
            while True:
                index = next(counter)
                scheduled_s = self.elapsed_s()
                if not self._more(index, scheduled_s):
                    return
                spec = next(self.specs, None)
                if spec is None:
                    return
                await self.one(index, scheduled_s, spec)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run_load(
    plan: LoadPlan,
    specs: Iterator[RequestSpec],
    client: Client,
    pick_url: PickUrl,
    *,
    sampler: EngineSampler | None = None,
    progress: Progress | None = None,
    label_replicas: bool = False,
    on_measured: OnMeasured | None = None,
) -> RunRecord:
    """Run `plan` and return every sample (warm-up ones marked). With `label_replicas`, a sample
    without `x-gateway-replica` is labelled with the `host:port` it was sent to (client-side routing)."""
    run = _Run(
        plan,
        specs,
        client,
        pick_url,
        sampler=sampler,
        progress=progress,
        label_replicas=label_replicas,
        on_measured=on_measured,
    )
    if sampler is not None:
        sampler.start(run.start)
        if plan.warmup_requests == 0 and plan.warmup_s == 0:
            await sampler.baseline()
            run.baseline_taken = True
    if progress is not None:
        progress.start(run.start)
    try:
        if isinstance(plan.arrivals, ClosedLoop):
            await run.closed_loop(plan.arrivals.concurrency)
        else:
            await run.open_loop(plan.arrivals.offsets_s(random.Random(f"arrivals-{plan.seed}")))
        if run.baseline_task is not None:
            await run.baseline_task
    finally:
        if progress is not None:
            progress.stop()
        if sampler is not None:
            await sampler.finish()
    run.record.wall_s = run.elapsed_s()
    run.record.samples.sort(key=lambda s: s.index)
    return run.record
