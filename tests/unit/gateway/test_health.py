"""Health thresholds against real HTTP endpoints on 127.0.0.1 (a mock engine and a closed port)."""

from __future__ import annotations

import random

import httpx

from core.clock import FakeClock
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.upstream.health import HealthChecker
from gateway.upstream.registry import ReplicaRegistry
from tests.servers import free_port


async def test_thresholds_take_a_dead_replica_out_and_bring_a_live_one_back(mock_engines) -> None:
    live = mock_engines(model="m")
    dead_url = f"http://127.0.0.1:{free_port()}"
    settings = parse_settings(
        {
            "pools": [
                {
                    "model": "m",
                    "replicas": {"static": [live.url, dead_url]},
                    "health": {"healthy_threshold": 2, "unhealthy_threshold": 3, "interval_s": 7},
                }
            ]
        }
    )
    clock = FakeClock(50.0)
    registry = ReplicaRegistry(settings, GatewayMetrics(), clock, random.Random(1))
    pool = registry.pools["m"]
    live_replica, dead_replica = pool.replicas.values()
    async with httpx.AsyncClient() as client:
        checker = HealthChecker(registry, client, clock, random.Random(1))
        for _ in range(2):
            await checker.probe_pool(pool)
        assert dead_replica.active_up, "two failures are below the threshold of three"
        await checker.probe_pool(pool)
        assert not dead_replica.active_up and live_replica.active_up
        assert [v.replica_id for v in pool.snapshot() if v.healthy] == [live_replica.replica_id]
        assert pool.retry_after_s() == 7, "Retry-After is the time to the next probe"
        health = pool.settings.health
        checker._apply("m", dead_replica, True, health, 60.0)
        assert not dead_replica.active_up, "one success is below the healthy threshold of two"
        checker._apply("m", dead_replica, False, health, 60.0)
        checker._apply("m", dead_replica, True, health, 60.0)
        assert not dead_replica.active_up, "a failure resets the success streak"
        checker._apply("m", dead_replica, True, health, 60.0)
        assert dead_replica.active_up
