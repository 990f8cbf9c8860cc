"""Engine load scraping: poll each replica's /metrics, publish an `EngineLoad` into `replica.engine`.

One `EngineScraper` serves one pool (one flavour). Its one asyncio task (`start()` / `stop()`) schedules
every replica on its own phase — a random offset in [0, interval_s) drawn when the replica is first
seen — so replicas are not polled in lockstep, and runs each scrape as a short-lived task; a replica is
never polled twice concurrently. The replica set is re-read from `targets()` on every wake-up
(discovery may add or remove replicas); a removed replica's gauges are removed.

Each scrape is one GET `{url}{path}` on the shared `httpx.AsyncClient`, bounded by `timeout_s` in total
(connect + headers + body). What is published after each scrape:

- a good sample → `sample.to_load(now)` (fresh, `age_s` ≈ 0); the replica's gauges are set;
- a failed scrape → counted in `errors{replica, reason}`; the last good sample stays published (with
  its growing `age_s`) while it is younger than `stale_after_s` — one lost scrape never flips routing;
- once the last good sample is older than `stale_after_s` (or no sample arrived within `stale_after_s` of
  the replica being first seen) the `on_stale` policy applies, counted once as reason `stale`, and the
  replica's gauges are removed (an unknown value is not exported as a number):
  * `saturated` (default): publish a verdict that routing avoids — `kv_usage_ratio=1.0`,
    `waiting=max(saturated_waiting_requests, last waiting)`, last `running` — with `stale=False`,
    because routing ignores stale samples (`router.load`, `router.scorers`). The waiting penalty is kept
    on the scale of B_max so normalised scorers still rank the healthy replicas. Rationale: an engine
    that cannot answer /metrics is more often overloaded (llama.cpp serves /metrics through its task
    queue) than idle;
  * `ignore`: publish `engine=None`; routing falls back to the gateway's own in-flight counts.

Before the first sample and within the bound, `engine` is None. Time: `clock` (injected) stamps samples
and measures age and staleness; the scheduler sleeps on the event loop's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from core.tasks import cancel_and_wait
from gateway.config.scrape_settings import OnStale, ScrapeSettings
from gateway.upstream.engine_metrics import (
    EngineMetricsError,
    EngineSample,
    MetricsAdapter,
    ScrapeErrorReason,
)
from gateway.upstream.scrape_metrics import ScrapeMetrics
from router.types import EngineLoad

Clock = Callable[[], float]

_log = logging.getLogger(__name__)


class ScrapeTarget(Protocol):
    """A replica as the scraper sees it (`gateway.upstream.registry.Replica` fits): `engine` is what
    routing reads; `engine_sampled` hears of each fresh sample, and None when samples went stale."""

    replica_id: str
    url: str
    engine: EngineLoad | None

    def engine_sampled(self, sample: EngineSample | None) -> bool:
        """True when the sample may have let the target take more requests (its cap grew)."""
        ...

    @property
    def learned_cap(self) -> int | None:
        """The batch budget the samples taught it (`llm_gateway_learned_max_concurrency`)."""
        ...

    @property
    def learned_cap_set_point_s(self) -> float | None:
        """The token latency that budget steers to (`llm_gateway_learned_cap_set_point_seconds`)."""
        ...

    @property
    def learned_cap_held_near_floor(self) -> bool:
        """That budget near its floor, the latency over it (`llm_gateway_learned_cap_held_at_floor`)."""
        ...


@dataclass(slots=True)
class _ReplicaState:
    first_seen_s: float
    next_due_s: float
    last: EngineSample | None = None
    stale_counted: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class EngineScraper:
    """Polls one pool's replicas (module docstring). `model` selects the served model's label sets."""

    def __init__(
        self,
        settings: ScrapeSettings,
        adapter: MetricsAdapter,
        targets: Callable[[], Iterable[ScrapeTarget]],
        client: httpx.AsyncClient,
        *,
        model: str | None = None,
        metrics: ScrapeMetrics | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        on_capacity: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self._adapter = adapter
        self._targets = targets
        self._client = client
        self._model = model
        self._metrics = metrics or ScrapeMetrics()
        self._clock = clock
        self._rng = rng or random.Random()
        self._on_capacity = on_capacity
        self._states: dict[str, _ReplicaState] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the polling task (idempotent). Needs a running event loop."""
        if not self.running:
            self._task = asyncio.create_task(self._run(), name=f"engine-scraper-{self._adapter.flavour}")

    async def stop(self) -> None:
        """Cancel the polling task and every scrape in flight, and wait for them to finish."""
        tasks = [self._task] if self._task is not None else []
        tasks += [s.task for s in self._states.values() if s.task is not None]
        self._task = None
        await cancel_and_wait(tasks)

    async def poll_once(self) -> None:
        """Scrape every current replica now, concurrently, and publish (for tests, or a caller's loop)."""
        loop_now = asyncio.get_running_loop().time()
        targets = self._reconcile(loop_now)
        await asyncio.gather(*(self._scrape_and_publish(t, self._states[t.replica_id]) for t in targets))

    async def _run(self) -> None:
        interval_s = self.settings.interval_s
        loop = asyncio.get_running_loop()
        while True:
            loop_now = loop.time()
            for target in self._reconcile(loop_now):
                state = self._states[target.replica_id]
                if state.next_due_s > loop_now:
                    continue
                state.next_due_s += interval_s
                if state.next_due_s <= loop_now:  # fell behind (a stalled loop): keep the phase, skip
                    state.next_due_s += interval_s * ((loop_now - state.next_due_s) // interval_s + 1)
                if state.task is None or state.task.done():
                    state.task = asyncio.create_task(self._scrape_and_publish(target, state))
                    state.task.add_done_callback(_log_unexpected)
            next_due = min((s.next_due_s for s in self._states.values()), default=loop_now + interval_s)
            await asyncio.sleep(min(interval_s, max(0.0, next_due - loop.time())))

    def _reconcile(self, loop_now: float) -> list[ScrapeTarget]:
        """Track new replicas (random phase), forget removed ones; the current targets."""
        targets = list(self._targets())
        current = {t.replica_id for t in targets}
        for replica_id in [rid for rid in self._states if rid not in current]:
            state = self._states.pop(replica_id)
            if state.task is not None:
                state.task.cancel()
            self._remove_gauges(replica_id)
        for target in targets:
            if target.replica_id not in self._states:
                phase_s = self._rng.uniform(0.0, self.settings.interval_s)
                self._states[target.replica_id] = _ReplicaState(self._clock(), loop_now + phase_s)
        return targets

    async def _scrape_and_publish(self, target: ScrapeTarget, state: _ReplicaState) -> None:
        fresh: EngineSample | None = None
        try:
            state.last = fresh = await self._scrape(target, state.last)
            state.stale_counted = False
        except EngineMetricsError as exc:
            self._count(target.replica_id, exc.reason)
        self._publish(target, state)
        if fresh is not None:
            if target.engine_sampled(fresh) and self._on_capacity is not None:
                self._on_capacity()  # waiters may fit now
            if self._metrics.learned_cap is not None:
                self._metrics.learned_cap.labels(target.replica_id).set(target.learned_cap or 0)
            if self._metrics.learned_set_point is not None:
                set_point_s = target.learned_cap_set_point_s
                self._metrics.learned_set_point.labels(target.replica_id).set(set_point_s or 0.0)
            if self._metrics.learned_floor is not None:
                held = target.learned_cap_held_near_floor
                self._metrics.learned_floor.labels(target.replica_id).set(1.0 if held else 0.0)

    async def _scrape(self, target: ScrapeTarget, previous: EngineSample | None) -> EngineSample:
        timeout_s = self.settings.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.get(target.url + self.settings.path, timeout=timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            raise EngineMetricsError(ScrapeErrorReason.TIMEOUT, f"no answer within {timeout_s} s") from None
        except httpx.ConnectError as exc:
            raise EngineMetricsError(ScrapeErrorReason.CONNECT, str(exc)) from None
        except httpx.HTTPError as exc:
            raise EngineMetricsError(ScrapeErrorReason.TRANSPORT, f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise EngineMetricsError(ScrapeErrorReason.HTTP_STATUS, f"status {response.status_code}")
        return self._adapter.sample(
            response.text, taken_at_s=self._clock(), previous=previous, model=self._model
        )

    def _publish(self, target: ScrapeTarget, state: _ReplicaState) -> None:
        now_s = self._clock()
        last = state.last
        age_s = now_s - (last.taken_at_s if last is not None else state.first_seen_s)
        if age_s <= self.settings.stale_bound_s:
            target.engine = last.to_load(now_s) if last is not None else None
            if last is not None:
                self._set_gauges(target.replica_id, last)
            return
        if not state.stale_counted:
            state.stale_counted = True
            self._count(target.replica_id, ScrapeErrorReason.STALE)
        self._remove_gauges(target.replica_id)
        target.engine = self._stale_load(last, age_s)
        target.engine_sampled(None)

    def _stale_load(self, last: EngineSample | None, age_s: float) -> EngineLoad | None:
        if self.settings.on_stale is OnStale.IGNORE:
            return None
        return EngineLoad(
            running=last.running if last is not None else 0.0,
            waiting=max(self.settings.saturated_waiting_requests, last.waiting if last is not None else 0.0),
            kv_usage_ratio=1.0,
            prefix_cache_hit_ratio=None,
            age_s=age_s,
            stale=False,
        )

    def _count(self, replica_id: str, reason: ScrapeErrorReason) -> None:
        if self._metrics.errors is not None:
            self._metrics.errors.labels(replica_id, reason.value).inc()

    def _set_gauges(self, replica_id: str, sample: EngineSample) -> None:
        m = self._metrics
        values = (
            (m.running, sample.running),
            (m.waiting, sample.waiting),
            (m.kv_usage_ratio, sample.kv_usage_ratio),
            (m.prefix_cache_hit_ratio, sample.prefix_cache_hit_ratio),
        )
        for gauge, value in values:
            if gauge is None:
                continue
            if value is None:
                gauge.remove(replica_id)
            else:
                gauge.labels(replica_id).set(value)
        if m.lora_adapters is not None and self._adapter.exports_lora:
            m.lora_adapters.labels(replica_id, "running").set(len(sample.running_adapters))
            m.lora_adapters.labels(replica_id, "waiting").set(len(sample.waiting_adapters))

    def _remove_gauges(self, replica_id: str) -> None:
        m = self._metrics
        for gauge in (m.running, m.waiting, m.kv_usage_ratio, m.prefix_cache_hit_ratio):
            if gauge is not None:
                gauge.remove(replica_id)
        if m.lora_adapters is not None:
            for state in ("running", "waiting"):
                with contextlib.suppress(KeyError):
                    m.lora_adapters.remove(replica_id, state)


def _log_unexpected(task: asyncio.Task[None]) -> None:
    """A scrape task that died of anything but an expected scrape failure is a bug: log it loudly."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("engine scrape task failed", exc_info=exc)
