"""The per-pool background loops that watch the replicas' engines: the /metrics scraper
(`gateway.upstream.scraper`) and model discovery (`gateway.upstream.model_discovery`). Built by the
composition root, which starts each and registers its `stop` for close."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Protocol

import httpx

from core.clock import Clock
from gateway.base.metrics import GatewayMetrics
from gateway.upstream.engine_metrics import adapter_for
from gateway.upstream.model_discovery import ModelDiscovery
from gateway.upstream.pool import Pool
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.scrape_metrics import ScrapeMetrics
from gateway.upstream.scraper import EngineScraper


class PoolWatcher(Protocol):
    def start(self) -> None: ...

    async def stop(self) -> None: ...


def pool_watchers(  # noqa: PLR0917 - the composition root's parts, passed as they are
    registry: ReplicaRegistry,
    control_client: httpx.AsyncClient,
    metrics: GatewayMetrics,
    clock: Clock,
    child_rng: Callable[[], random.Random],
    engine_keys: Mapping[str, str],
) -> list[PoolWatcher]:
    """A scraper per pool (unless disabled, or the flavour exports nothing) and a model discovery per
    pool with `models.discover` (a disaggregated pool's prefill set included: it is a pool too)."""
    watchers: list[PoolWatcher] = []
    for pool in registry.pools.values():
        scraper = _scraper(pool, control_client, metrics, clock, child_rng(), registry.notify_capacity)
        if scraper is not None:
            watchers.append(scraper)
        if pool.settings.models.discover:
            watchers.append(
                ModelDiscovery(
                    pool,
                    control_client,
                    registry.set_replica_models,
                    engine_key=engine_keys.get(pool.model),
                    on_error=lambda replica_id: metrics.model_discovery_errors_total.labels(replica_id).inc(),
                )
            )
    return watchers


def _scraper(  # noqa: PLR0917 - the composition root's parts
    pool: Pool,
    client: httpx.AsyncClient,
    metrics: GatewayMetrics,
    clock: Clock,
    rng: random.Random,
    on_capacity: Callable[[], None],
) -> EngineScraper | None:
    adapter = adapter_for(pool.settings.engine)
    if adapter is None or not pool.settings.scrape.enabled:
        return None
    m = metrics
    return EngineScraper(
        pool.settings.scrape,
        adapter,
        pool.replicas.values,
        client,
        model=pool.settings.upstream_model or pool.model,
        metrics=ScrapeMetrics(
            errors=m.scrape_errors_total,
            running=m.replica_engine_running,
            waiting=m.replica_engine_waiting,
            kv_usage_ratio=m.replica_kv_usage_ratio,
            prefix_cache_hit_ratio=m.replica_prefix_cache_hit_ratio,
            lora_adapters=m.replica_lora_adapters,
            learned_cap=m.learned_max_concurrency,
            learned_set_point=m.learned_cap_set_point_seconds,
            learned_floor=m.learned_cap_held_at_floor,
        ),
        clock=clock.now_s,
        rng=rng,
        on_capacity=on_capacity,
    )
