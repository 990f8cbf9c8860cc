"""Active health checks: every `interval_s` each pool probes all its replicas concurrently.

Probe: GET `health.path` (default by engine flavour: `/health` for vLLM, SGLang, TGI and llama.cpp,
`/v1/models` for a generic OpenAI server) with `timeout_s`; a 2xx is a success, anything else (status,
timeout, refused) a failure. `unhealthy_threshold` failures in a row take a replica out of routing,
`healthy_threshold` successes in a row bring it back. Replicas start healthy (traffic flows before the
first probe; passive signals catch a dead one fast). Membership changes are picked up at the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

import httpx

from core.clock import Clock
from core.tasks import cancel_and_wait
from gateway.config.settings import HealthCheckSettings
from gateway.upstream.registry import Pool, ReplicaRegistry
from gateway.upstream.replica import Replica

logger = logging.getLogger(__name__)

DEFAULT_HEALTH_PATHS = {
    "vllm": "/health",
    "sglang": "/health",
    "tgi": "/health",
    "llamacpp": "/health",
    "openai": "/v1/models",
}


@dataclass(slots=True)
class _Streak:
    successes: int = 0
    failures: int = 0


class HealthChecker:
    """One probing task per pool (see module docstring)."""

    def __init__(
        self, registry: ReplicaRegistry, client: httpx.AsyncClient, clock: Clock, rng: random.Random
    ) -> None:
        self._registry = registry
        self._client = client
        self._clock = clock
        self._rng = rng
        self._streaks: dict[tuple[str, str], _Streak] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for pool in self._registry.pools.values():
            if pool.settings.health.enabled:
                self._tasks.append(asyncio.create_task(self._run(pool), name=f"health-{pool.model}"))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def _run(self, pool: Pool) -> None:
        settings = pool.settings.health
        await asyncio.sleep(self._rng.uniform(0, settings.interval_s))
        while True:
            await self.probe_pool(pool)
            await asyncio.sleep(settings.interval_s)

    async def probe_pool(self, pool: Pool) -> None:
        """Probe every replica of `pool` once and apply the thresholds."""
        settings = pool.settings.health
        path = settings.path or DEFAULT_HEALTH_PATHS[pool.settings.engine]
        replicas = list(pool.replicas.values())
        results = await asyncio.gather(*(self._probe(r, path, settings.timeout_s) for r in replicas))
        next_probe_s = self._clock.now_s() + settings.interval_s
        for replica, ok in zip(replicas, results, strict=True):
            self._apply(pool.model, replica, ok, settings, next_probe_s)

    async def _probe(self, replica: Replica, path: str, timeout_s: float) -> bool:
        try:
            response = await self._client.get(replica.url + path, timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 300

    def _apply(
        self, model: str, replica: Replica, ok: bool, settings: HealthCheckSettings, next_probe_s: float
    ) -> None:
        streak = self._streaks.setdefault((model, replica.replica_id), _Streak())
        if ok:
            streak.successes, streak.failures = streak.successes + 1, 0
        else:
            streak.successes, streak.failures = 0, streak.failures + 1
        up = replica.active_up
        if up and streak.failures >= settings.unhealthy_threshold:
            up = False
            logger.warning(
                "replica %s failed %d health checks: out of rotation", replica.replica_id, streak.failures
            )
        elif not up and streak.successes >= settings.healthy_threshold:
            up = True
            logger.warning(
                "replica %s passed %d health checks: back in rotation", replica.replica_id, streak.successes
            )
        self._registry.set_active_health(replica, up, next_probe_s)
