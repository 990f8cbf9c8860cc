"""Gateway membership against the real Redis: k counts the live instances, an instance that stops
heartbeating drops out after the ttl, one that leaves drops out at once, the autoscalers' traffic share
follows, and an unreachable Redis keeps the last known k until it answers again."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from core.clock import FakeClock
from core.shared_state import RedisBackend
from core.state_outage import RedisOperation
from gateway.app import GatewayApp
from gateway.base.metrics import GatewayMetrics
from gateway.config.settings import parse_settings
from gateway.fleet.autoscaling import AutoscaleSignals
from gateway.fleet.instance_membership import GatewayMembership, RedisMembership
from gateway.upstream.registry import ReplicaRegistry

from .conftest import REDIS_URL, BackendFactory, TcpProxy

pytestmark = pytest.mark.redis

MODEL = "membership-model"
TTL_S = 9.0  # heartbeat every 3 s


def _pool(**autoscale: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "replicas": {"static": ["http://127.0.0.1:1"]},
        "max_concurrency_per_replica": 8,
        "autoscale": {"decode_tokens_per_s": 1000, **autoscale},
    }


def _signals(clock: FakeClock) -> AutoscaleSignals:
    settings = parse_settings({"pools": [_pool()]})
    metrics = GatewayMetrics()
    return AutoscaleSignals(
        ReplicaRegistry(settings, metrics, clock, random.Random(0)), metrics, clock, lambda _: 0
    )


def _member(
    backend: RedisBackend,
    clock: FakeClock,
    on_count: Callable[[int], None] | None = None,
    ttl_s: float = TTL_S,
) -> GatewayMembership:
    return GatewayMembership(
        RedisMembership(backend), ttl_s=ttl_s, clock=clock, on_count=on_count or (lambda _: None)
    )


async def test_k_counts_live_instances_and_the_share_follows(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=1000.0)  # the scripts' time too
    signals = _signals(clock)
    scaler = signals.scalers[MODEL]
    a = _member(make_backend(script_time=clock), clock, signals.set_gateway_instances)
    b, c = (_member(make_backend(script_time=clock), clock) for _ in range(2))
    assert [await a.heartbeat(), await b.heartbeat(), await c.heartbeat()] == [1, 2, 3]
    assert scaler.traffic_share_ratio == 1.0  # a has not heard of b and c yet
    assert await a.heartbeat() == 3
    assert scaler.traffic_share_ratio == pytest.approx(1 / 3)
    key = f"{key_prefix}gateways"
    assert set(await raw_redis.zrange(key, 0, -1)) == {a.instance_id, b.instance_id, c.instance_id}
    assert 0 < await raw_redis.pttl(key) <= (TTL_S + 1) * 1000  # a deployment that is gone leaves no key

    # c stops heartbeating without leaving (SIGKILL): counted until its ttl has run out, then not
    for _ in range(2):
        clock.advance(a.period_s)
        assert (await a.heartbeat(), await b.heartbeat()) == (3, 3)
    clock.advance(a.period_s)  # exactly TTL_S after c's last heartbeat
    assert await a.heartbeat() == 2
    assert scaler.traffic_share_ratio == 0.5
    assert c.instance_id not in await raw_redis.zrange(key, 0, -1)

    # b leaves (graceful stop): gone at once, no clock advance needed
    await b.leave()
    assert await a.heartbeat() == 1
    assert scaler.traffic_share_ratio == 1.0


async def test_the_share_is_exported_as_one_over_k(make_backend: BackendFactory) -> None:
    clock = FakeClock(start_s=50.0)
    signals = _signals(clock)
    members = [
        _member(make_backend(script_time=clock), clock, signals.set_gateway_instances) for _ in range(2)
    ]
    for member in members:
        await member.heartbeat()
    await members[0].heartbeat()
    clock.advance(15.0)  # one evaluation period
    signals.sample_and_export()
    value = signals._metrics.registry.get_sample_value(
        "llm_gateway_autoscale_traffic_share_ratio", {"pool": MODEL}
    )
    assert value == 0.5


async def test_with_server_time_an_instance_that_stops_beating_drops_out(
    make_backend: BackendFactory,
) -> None:
    counts: list[int] = []
    clock = FakeClock()  # only for the age in logs: the scripts use Redis TIME here
    survivor = _member(make_backend(), clock, counts.append, ttl_s=0.3)  # heartbeat every 0.1 s
    stopped = _member(make_backend(), clock, ttl_s=0.3)
    assert await stopped.heartbeat() == 1  # one heartbeat, then silence
    survivor.start()
    started_s = time.monotonic()
    try:
        while counts != [2, 1] and time.monotonic() - started_s < 3.0:
            await asyncio.sleep(0.02)
        assert counts == [2, 1]
        assert time.monotonic() - started_s <= 0.3 + 0.1 + 0.3  # ttl + one period, plus slack
    finally:
        await survivor.leave()


async def test_unreachable_redis_keeps_the_last_known_k_and_recovers(
    make_backend: BackendFactory, redis_proxy: TcpProxy
) -> None:
    clock = FakeClock(start_s=10.0)
    errors: list[RedisOperation] = []
    counts: list[int] = []
    flaky = make_backend(redis_proxy.url, script_time=clock, on_error_callback=errors.append)
    a = _member(flaky, clock, counts.append)
    b = _member(make_backend(script_time=clock), clock)
    await b.heartbeat()
    assert await a.heartbeat() == 2
    await redis_proxy.stop()
    clock.advance(a.period_s)
    await b.heartbeat()
    assert await a.heartbeat() == 2  # unreachable: the last known k
    assert await a.heartbeat() == 2
    assert errors == [RedisOperation.MEMBERSHIP_HEARTBEAT] * 2 and flaky.errors_total == 2
    assert a.count.failures == 2 and a.count.age_s() == a.period_s
    await b.leave()
    await redis_proxy.start()  # same port: recovers by itself
    assert await a.heartbeat() == 1
    assert counts == [2, 1] and a.count.failures == 0 and flaky.available


async def test_gateways_measure_each_other_and_a_draining_one_leaves(
    key_prefix: str, raw_redis: Redis
) -> None:
    """Two in-process gateway apps with Redis state: each exports share 1/2; draining one leaves the
    membership at once, and the other's share goes back to 1 at its next heartbeat."""
    raw = {
        "server": {"host": "127.0.0.1", "port": 0, "drain_timeout_s": 1},
        "pools": [_pool(evaluation_period_s=1, window_s=2)],
        "state": {
            "backend": "redis",
            "url": REDIS_URL,
            "key_prefix": key_prefix,
            "replica_lease_ttl_s": 0.3,
        },
    }
    apps = [GatewayApp(parse_settings(raw)) for _ in range(2)]
    for app in apps:
        await app.startup()

    def shares() -> list[float]:
        result = []
        for app in apps:
            assert app.state.signals is not None
            result.append(app.state.signals.scalers[MODEL].traffic_share_ratio)
        return result

    async def wait_for(wanted: list[float]) -> list[float]:
        deadline = time.monotonic() + 3.0
        while shares() != wanted and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return shares()

    try:
        assert await wait_for([0.5, 0.5]) == [0.5, 0.5]
        assert await raw_redis.zcard(f"{key_prefix}gateways") == 2
        await apps[1].drain()
        assert await raw_redis.zcard(f"{key_prefix}gateways") == 1
        assert await wait_for([1.0, 0.5]) == [1.0, 0.5]  # the drained one keeps its last k
    finally:
        for app in apps:
            await app.shutdown()
    assert await raw_redis.zcard(f"{key_prefix}gateways") == 0
