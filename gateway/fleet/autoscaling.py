"""Feeds the live autoscaling signal (`capacity.autoscale`) from what the gateway measures, and exports it.

Per pool with `autoscale:` configured, a `PoolAutoscaler` receives: an arrival per request (before
admission, so shed load counts), the queue wait of each dispatched request, each successful completion
(output tokens, e2e, TTFT, TPOT), and every `SAMPLE_INTERVAL_S` the admission queue depth and each
replica's running batch (the engine's report, else the gateway's own in-flight count). The decision is
exported as `llm_gateway_desired_replicas{pool}` plus the inputs that drove it; GPU utilisation is not
an input. Each gateway instance sees only its share of the traffic: with k instances behind a load
balancer every pool's autoscaler divides its arrival rates by the traffic share 1/k
(`llm_gateway_autoscale_traffic_share_ratio`), so every instance estimates for the whole pool and
`max()` over instances is the aggregate to scale on. k is the pool's `autoscale.gateway_instances` when
set, else the live instance count that `gateway.fleet.instance_membership` measures in Redis
(`set_gateway_instances`),
else 1.

The per-request inputs come from the serve path's event port (`AutoscaleSink`, subscribed by the
composition root when some pool has `autoscale:`): `arrived`, `admitted`, `served` and, for a
disaggregated pool, `prefilled`. Its two sets each have their autoscaler (`<model>/prefill` for the
prefill set): an arrival and a queue wait for each request on both (they share the pool's one queue,
whose depth both sample), a served request's completion on the decode set, and each prefill leg on the
prefill set (one token; its time in the set is the leg's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import Gauge

from capacity.autoscale import GaugeSample, PoolAutoscaler
from capacity.autoscale_settings import AutoscaleSettings, PoolCapacity
from core.clock import Clock
from core.tasks import cancel_and_wait
from gateway.base.metric_naming import WORKERS_MAX
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import PoolSettings
from gateway.fleet.instance_membership import traffic_share
from gateway.observability.events import ServeEventSink
from gateway.upstream.registry import Pool, ReplicaRegistry

if TYPE_CHECKING:
    from gateway.proxy.context import RequestContext
    from gateway.proxy.reply import Reply

SAMPLE_INTERVAL_S = 1.0


def _autoscaler(pool: PoolSettings, clock: Clock, replicas: int) -> PoolAutoscaler | None:
    config = pool.autoscale
    if config is None:
        return None
    b_max = config.b_max or pool.max_concurrency_per_replica
    assert b_max is not None  # settings validation
    capacity = PoolCapacity(b_max, config.decode_tokens_per_s, config.ttft_p95_slo_s, config.tpot_p95_slo_s)
    settings = AutoscaleSettings(
        window_s=config.window_s,
        evaluation_period_s=config.evaluation_period_s,
        scale_up_utilisation_ratio=config.scale_up_utilisation_ratio,
        scale_down_utilisation_ratio=config.scale_down_utilisation_ratio,
        scale_down_cooldown_s=config.scale_down_cooldown_s,
        min_replicas=config.min_replicas,
        max_replicas=config.max_replicas,
    )
    return PoolAutoscaler(pool.model, capacity, clock, settings, initial_replicas=max(1, replicas))


class AutoscaleSignals:
    """All pools' autoscalers, their inputs and their export (module docstring)."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        metrics: GatewayMetrics,
        clock: Clock,
        queue_depth_of: Callable[[str], int],
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._queue_depth_of = queue_depth_of
        self._queue_of = {p.prefill.model: p.model for p in registry.pools.values() if p.prefill is not None}
        """A prefill set's queue is its pool's."""
        self._scalers: dict[str, PoolAutoscaler] = {}
        self._configured_instances: dict[str, int | None] = {}
        for pool in registry.pools.values():
            scaler = _autoscaler(pool.settings, clock, len(pool.replicas))
            if scaler is not None:
                assert pool.settings.autoscale is not None
                configured = pool.settings.autoscale.gateway_instances
                scaler.set_traffic_share(traffic_share(configured, 1))
                self._scalers[pool.model] = scaler
                self._configured_instances[pool.model] = configured
        self._gauges: dict[str, Gauge] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def scalers(self) -> Mapping[str, PoolAutoscaler]:
        """The autoscaler of each pool with `autoscale:` configured, by model."""
        return self._scalers

    @property
    def measures_gateway_instances(self) -> bool:
        """Whether some pool's share follows the measured instance count (no `gateway_instances` set)."""
        return any(configured is None for configured in self._configured_instances.values())

    def set_gateway_instances(self, measured: int) -> None:
        """k live gateway instances (measured by `gateway.fleet.instance_membership`): the traffic share
        becomes 1/k in
        every pool without a configured `autoscale.gateway_instances`."""
        for model, scaler in self._scalers.items():
            scaler.set_traffic_share(traffic_share(self._configured_instances[model], measured))

    def arrival(self, model: str) -> None:
        scaler = self._scalers.get(model)
        if scaler is not None:
            scaler.observe_arrival()

    def dispatched(self, model: str, queue_wait_s: float) -> None:
        scaler = self._scalers.get(model)
        if scaler is not None:
            scaler.observe_queue_wait(queue_wait_s)

    def completed(
        self, model: str, *, output_tokens: int, e2e_s: float, ttft_s: float | None, queue_wait_s: float
    ) -> None:
        scaler = self._scalers.get(model)
        if scaler is not None:
            scaler.observe_completion(output_tokens, e2e_s, ttft_s=ttft_s, queue_wait_s=queue_wait_s)

    def start(self) -> None:
        if self._scalers and self._task is None:
            self._task = asyncio.create_task(self._run(), name="autoscale-signal")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait([task])

    async def _run(self) -> None:
        while True:
            self.sample_and_export()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sample_and_export(self) -> None:
        """Feed the periodic inputs, evaluate when a period has passed, export the latest decision."""
        for model, scaler in self._scalers.items():
            pool = self._registry.pools[model]
            scaler.observe_queue_depth(self._queue_depth_of(self._queue_of.get(model, model)))
            for replica in pool.replicas.values():
                engine = replica.engine
                running = (
                    engine.running if engine is not None and not engine.stale else replica.inflight_requests
                )
                scaler.observe_engine_running(replica.replica_id, float(running))
            decision = scaler.poll()
            if decision is not None:
                for sample in decision.gauges():
                    self._export(sample)

    def _export(self, sample: GaugeSample) -> None:
        gauge = self._gauges.get(sample.name)
        if gauge is None:
            gauge = Gauge(
                sample.name,
                f"Autoscaling signal: {sample.name}",
                list(sample.labels),
                registry=self._metrics.registry,
                multiprocess_mode=WORKERS_MAX,  # each worker estimates for the whole pool
            )
            self._gauges[sample.name] = gauge
        gauge.labels(**sample.labels).set(sample.value)


class AutoscaleSink(ServeEventSink):
    """The autoscaling signal's subscription to the serve path's events (module docstring)."""

    def __init__(self, signals: AutoscaleSignals) -> None:
        self._signals = signals

    def arrived(self, ctx: RequestContext, queue_depth: Callable[[], int]) -> None:
        for pool in _sets(ctx.pool):
            self._signals.arrival(pool.model)

    def admitted(self, ctx: RequestContext, queue_wait_s: float) -> None:
        for pool in _sets(ctx.pool):
            self._signals.dispatched(pool.model, queue_wait_s)

    def prefilled(self, ctx: RequestContext, pool: Pool, leg_s: float) -> None:
        self._signals.completed(pool.model, output_tokens=1, e2e_s=leg_s, ttft_s=leg_s, queue_wait_s=0.0)

    def served(self, ctx: RequestContext, reply: Reply) -> None:
        completion = (reply.usage or {}).get("completion_tokens")
        if isinstance(completion, int):
            self._signals.completed(
                ctx.model,
                output_tokens=completion,
                e2e_s=reply.elapsed_s(),
                ttft_s=reply.first_output_s,
                queue_wait_s=reply.queue_wait_s,
            )


def _sets(pool: Pool) -> tuple[Pool, ...]:
    """The replica sets of a client-facing pool: itself, and a disaggregated pool's prefill set."""
    return (pool,) if pool.prefill is None else (pool, pool.prefill)
