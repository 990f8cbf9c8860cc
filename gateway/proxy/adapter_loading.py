"""Loading a LoRA adapter onto a replica at run time, when a request names one no replica serves.

A pool's `models.adapters` lists adapters the gateway may load (name → path; vLLM serves
`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` when started with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). Before admission, a request for such an adapter that no
routable replica serves triggers one load:

- target: among routable, non-draining replicas of the pool holding fewer than
  `max_adapters_per_replica` adapters (those they list beyond the pool's declared names), the one with
  the fewest requests in flight (ties: the fewest adapters, then the replica id);
- one load per (pool, adapter) at a time: concurrent requests for it wait on the same load;
- the engine's 200 — or its 400 "has already been loaded" — makes the adapter part of that replica's
  list at once (`ReplicaRegistry.set_replica_models`; discovery confirms it at its next read), and the
  request goes on to admission, which routes it there;
- no candidate (every replica full, or none routable), a failed load (status, connect, timeout after
  `load_timeout_s`): the request is refused with 503 `no_replica` naming the adapter and why, with the
  pool's Retry-After; the next request tries again.

Counted in `llm_gateway_adapter_loads_total{model,outcome}` (`loaded`, `failed`, `full`). The gateway
never unloads an adapter: an operator (or the engine's own LRU) does; requests running on it would
fail otherwise. Spreading an adapter to more replicas under load is not done either: a request for an
adapter that is served waits for the replicas that serve it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import httpx

from core.clock import Clock
from gateway.base.errors import NoReplica
from gateway.base.metrics import GatewayMetrics
from gateway.upstream.pool import Pool
from gateway.upstream.registry import ReplicaRegistry
from gateway.upstream.replica import Replica

_log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"


class AdapterLoader:
    """Loads adapters on demand (module docstring); one per gateway instance."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        client: httpx.AsyncClient,
        metrics: GatewayMetrics,
        engine_keys: Mapping[str, str],
        clock: Clock,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._client = client
        self._metrics = metrics
        self._engine_keys = dict(engine_keys)
        self._loading: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def ensure(self, pool: Pool, name: str) -> None:
        """Return once a routable replica of `pool` serves `name` (loading it when it is a loadable
        adapter nobody serves); raise `NoReplica` when it cannot be loaded. Other names: no-op."""
        if name not in pool.loadable_models or pool.has_eligible_replica(name):
            return
        key = (pool.model, name)
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.create_task(self._load(pool, name))
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        try:
            await asyncio.shield(task)
        except NoReplica as refused:  # one error object per request: each answer may annotate its own
            raise NoReplica(refused.message, retry_after_s=refused.retry_after_s) from None

    async def _load(self, pool: Pool, name: str) -> None:
        replica = self._target(pool)
        if replica is None:
            self._count(pool, "full")
            bound = pool.settings.models.max_adapters_per_replica
            raise NoReplica(
                f"adapter {name!r} of pool {pool.model!r} is not loaded and no replica can take it "
                f"(every routable replica holds {bound} adapters, or none is routable)",
                retry_after_s=pool.retry_after_s(),
            )
        why = await self._post(pool, replica, name)
        if why is not None:
            self._count(pool, "failed")
            _log.warning("loading adapter %s onto %s failed: %s", name, replica.replica_id, why)
            raise NoReplica(
                f"adapter {name!r} could not be loaded onto {replica.replica_id}: {why}",
                retry_after_s=pool.retry_after_s(),
            )
        self._count(pool, "loaded")
        _log.info("loaded adapter %s onto %s (pool %s)", name, replica.replica_id, pool.model)
        models = (replica.models or pool.declared_models) | {name}
        self._registry.set_replica_models(pool, replica, models)

    def _target(self, pool: Pool) -> Replica | None:
        bound = pool.settings.models.max_adapters_per_replica
        now_s = self._clock.now_s()
        candidates = []
        for replica in pool.replicas.values():
            adapters = len((replica.models or frozenset()) - pool.declared_models)
            if replica.routable_at(now_s) and (bound is None or adapters < bound):
                candidates.append((replica.inflight_requests, adapters, replica.replica_id, replica))
        return min(candidates, key=lambda c: c[:3])[3] if candidates else None

    async def _post(self, pool: Pool, replica: Replica, name: str) -> str | None:
        """None when the replica holds `name` now, else why not."""
        settings = pool.settings.models
        key = self._engine_keys.get(pool.model)
        headers = {} if key is None else {"authorization": f"Bearer {key}"}
        body = {"lora_name": name, "lora_path": settings.adapters[name]}
        try:
            async with asyncio.timeout(settings.load_timeout_s):
                response = await self._client.post(
                    replica.url + LOAD_PATH, json=body, headers=headers, timeout=settings.load_timeout_s
                )
        except (TimeoutError, httpx.HTTPError) as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if response.status_code == 200 or (
            response.status_code == 400 and "already been loaded" in response.text
        ):
            return None
        return f"status {response.status_code}: {response.text[:200]}"

    def _count(self, pool: Pool, outcome: str) -> None:
        self._metrics.adapter_loads_total.labels(pool.model, outcome).inc()
