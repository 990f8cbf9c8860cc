"""The one place where mutable replica state lives; policies only ever see frozen `ReplicaView`s.

Load accounting is an `InflightGuard` per request: acquired when a replica is chosen, released exactly
once (idempotent) in the proxy's `finally` on every path — success, upstream error, retry, timeout,
client disconnect, cancellation. In-flight counts therefore return to zero when traffic stops.

Passive health: a connect failure marks a replica down until `recheck_at_s`, with exponential backoff
(`down_backoff_initial_s` doubling per consecutive failure up to `down_backoff_max_s`); the first
request after that time probes it (it becomes eligible again), and a success clears the backoff.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.metrics import GatewayMetrics
from gateway.settings import PoolSettings, Settings
from router.keys import KeySettings
from router.presets import PolicyContext, build_policy
from router.profile import Policy
from router.types import EngineLoad, ReplicaView

Clock = Callable[[], float]

DOWN_BACKOFF_INITIAL_S = 1.0
DOWN_BACKOFF_MAX_S = 30.0


def replica_id_for(url: str) -> str:
    """A stable, label-safe id for a replica URL: `host:port`."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


@dataclass(slots=True)
class Replica:
    """Mutable state of one replica in one pool. Mutated only through the registry and guards."""

    replica_id: str
    url: str
    max_concurrency: int | None = None
    healthy: bool = True
    draining: bool = False
    breaker_open: bool = False
    inflight_requests: int = 0
    inflight_tokens: int = 0
    consecutive_connect_failures: int = 0
    recheck_at_s: float = 0.0
    engine: EngineLoad | None = None

    def view(self) -> ReplicaView:
        return ReplicaView(
            replica_id=self.replica_id,
            url=self.url,
            healthy=self.healthy,
            draining=self.draining,
            breaker_open=self.breaker_open,
            inflight_requests=self.inflight_requests,
            inflight_tokens=self.inflight_tokens,
            max_concurrency=self.max_concurrency,
            engine=self.engine,
        )


class InflightGuard:
    """One request's claim on a replica. `release()` is idempotent; call it in `finally`."""

    __slots__ = ("_metrics", "_on_release", "_released", "replica", "tokens")

    def __init__(
        self, replica: Replica, tokens: int, metrics: GatewayMetrics, on_release: Callable[[], None]
    ) -> None:
        self.replica = replica
        self.tokens = tokens
        self._metrics = metrics
        self._on_release = on_release
        self._released = False
        replica.inflight_requests += 1
        replica.inflight_tokens += tokens
        metrics.inflight.labels(replica.replica_id).inc()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.replica.inflight_requests -= 1
        self.replica.inflight_tokens -= self.tokens
        self._metrics.inflight.labels(self.replica.replica_id).dec()
        self._on_release()


class Pool:
    """The replicas serving one client-facing model, and the routing policy over them."""

    def __init__(self, settings: PoolSettings, policy: Policy, clock: Clock) -> None:
        self.settings = settings
        self.policy = policy
        self.key_settings = KeySettings.from_options(settings.policy_options)
        self._clock = clock
        self.replicas: dict[str, Replica] = {}
        for url in settings.replicas.static:
            rid = replica_id_for(url)
            self.replicas[rid] = Replica(rid, url, settings.max_concurrency_per_replica)

    @property
    def model(self) -> str:
        return self.settings.model

    def snapshot(self) -> tuple[ReplicaView, ...]:
        """Frozen views for one routing decision; replicas past their recheck time become probe-able."""
        now_s = self._clock()
        for replica in self.replicas.values():
            if not replica.healthy and now_s >= replica.recheck_at_s:
                replica.healthy = True
        return tuple(r.view() for r in self.replicas.values())

    def seconds_until_recovery(self) -> float | None:
        """Time until the earliest ineligible replica may be tried again (for `Retry-After`)."""
        now_s = self._clock()
        waits = [max(0.0, r.recheck_at_s - now_s) for r in self.replicas.values() if not r.healthy]
        return min(waits) if waits else None


class ReplicaRegistry:
    """All pools by model name; the only writer of replica state."""

    def __init__(self, settings: Settings, metrics: GatewayMetrics, clock: Clock, rng: random.Random) -> None:
        self._metrics = metrics
        self._clock = clock
        self.pools: dict[str, Pool] = {}
        self._total_inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        for pool_settings in settings.pools:
            ctx = PolicyContext(rng=random.Random(rng.random()), options=pool_settings.policy_options)
            policy = build_policy(pool_settings.policy, ctx)
            self.pools[pool_settings.model] = Pool(pool_settings, policy, clock)
        for replica in self.all_replicas():
            metrics.inflight.labels(replica.replica_id).set(0)
            metrics.replica_up.labels(replica.replica_id).set(1)

    def pool(self, model: str) -> Pool | None:
        return self.pools.get(model)

    def all_replicas(self) -> Iterator[Replica]:
        for pool in self.pools.values():
            yield from pool.replicas.values()

    def acquire(self, replica: Replica, tokens: int) -> InflightGuard:
        self._total_inflight += 1
        self._idle.clear()
        return InflightGuard(replica, tokens, self._metrics, self._released_one)

    def _released_one(self) -> None:
        self._total_inflight -= 1
        if self._total_inflight == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request holds a replica (used by the shutdown drain)."""
        await self._idle.wait()

    def record_connect_failure(self, replica: Replica) -> None:
        """Passive health: refuse traffic to `replica` until its backoff expires (module docstring)."""
        replica.consecutive_connect_failures += 1
        backoff_s = min(
            DOWN_BACKOFF_MAX_S,
            DOWN_BACKOFF_INITIAL_S * 2 ** (replica.consecutive_connect_failures - 1),
        )
        replica.healthy = False
        replica.recheck_at_s = self._clock() + backoff_s
        self._metrics.replica_up.labels(replica.replica_id).set(0)

    def record_success(self, replica: Replica) -> None:
        if replica.consecutive_connect_failures:
            replica.consecutive_connect_failures = 0
            self._metrics.replica_up.labels(replica.replica_id).set(1)

    def total_inflight(self) -> int:
        return self._total_inflight
