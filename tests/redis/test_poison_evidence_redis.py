"""Poison evidence shared through Redis (gateway.proxy.stores.poison_evidence_redis): where a fingerprint
failed is seen by every instance, and two gateways sharing Redis quarantine identical poison requests that
failed once on each."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from core.clock import FakeClock
from gateway.proxy.stores.poison_evidence_redis import RedisEvidence
from gateway.proxy.stores.quarantine_redis import SYNC_INTERVAL_S
from gateway.upstream.failure_kinds import FailureKind
from mock_engine.faults import FaultSettings
from tests.faults.test_containment import MARKER
from tests.servers import ServerThread, gateway_settings

from .conftest import CLOSED_PORT_URL, REDIS_URL, BackendFactory

pytestmark = pytest.mark.redis
ERROR = FailureKind.STATUS_5XX


def _where(found: tuple[Any, ...]) -> set[tuple[str, FailureKind]]:
    return {(s.replica_id, s.kind) for s in found}


async def test_a_sighting_reaches_every_instance(make_backend: BackendFactory) -> None:
    clock = FakeClock(start_s=0.0)
    one = RedisEvidence(make_backend(), "m", clock, window_s=60.0, max_entries=100)
    two = RedisEvidence(make_backend(), "m", clock, window_s=60.0, max_entries=100)
    other_pool = RedisEvidence(make_backend(), "other", clock, window_s=60.0, max_entries=100)
    assert _where(await one.add("fp", "a", ERROR)) == {("a", ERROR)}
    assert not two.active, "not synced yet"
    both = await two.add("fp", "b", ERROR)
    assert _where(both) == {("a", ERROR), ("b", ERROR)}, "the add answers with every instance's"
    assert _where(two.sightings("fp")) == {("a", ERROR), ("b", ERROR)}, "and the mirror has them at once"
    assert await one.sync() and await other_pool.sync()
    assert _where(one.sightings("fp")) == {("a", ERROR), ("b", ERROR)}
    assert not other_pool.active, "per pool"
    await one.clear("fp")
    assert await two.sync()
    assert two.sightings("fp") == () and not two.active, "a served fingerprint is cleared everywhere"


async def test_sightings_expire_after_the_window_and_the_hash_keeps_at_most_max_entries(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    clock = FakeClock(start_s=100.0)
    store = RedisEvidence(make_backend(script_time=clock), "m", clock, window_s=60.0, max_entries=2)
    await store.add("a", "r1", ERROR)
    clock.advance(30.0)
    await store.add("b", "r1", ERROR)
    await store.add("c", "r1", ERROR)  # full: not stored in Redis
    assert await raw_redis.hlen(f"{key_prefix}evidence:m") == 2
    clock.advance(31.0)
    assert await store.sync()
    assert store.sightings("a") == () and _where(store.sightings("b")) == {("r1", ERROR)}
    assert await raw_redis.hkeys(f"{key_prefix}evidence:m") == ["b"], "expired fingerprints deleted"


async def test_redis_down_keeps_the_evidence_local(make_backend: BackendFactory) -> None:
    clock = FakeClock(start_s=0.0)
    errors: list[object] = []
    store = RedisEvidence(
        make_backend(CLOSED_PORT_URL, on_error_callback=errors.append),
        "m",
        clock,
        window_s=60.0,
        max_entries=10,
    )
    assert _where(await store.add("fp", "a", ERROR)) == {("a", ERROR)}
    assert errors, "counted as a state error"
    assert not await store.sync()
    assert _where(store.sightings("fp")) == {("a", ERROR)}, "a failed sync keeps the mirror"


def test_two_gateways_sharing_redis_quarantine_a_prompt_that_failed_once_on_each(
    mock_engines: Callable[..., ServerThread],
    gateways: Callable[[dict[str, Any]], ServerThread],
    key_prefix: str,
    raw_redis: Redis,
) -> None:
    """`max_attempts: 1` on both: a poison prompt fails once through the first gateway; through the
    second, which learns where it failed from Redis, it goes to the other replica, fails there and is
    quarantined; both refuse it at arrival after."""
    poison = FaultSettings(poison_marker=MARKER, poison_effect="error")
    engines = [mock_engines(model="m", token_delay_ms=5, faults=poison) for _ in range(2)]
    pool = {
        "model": "m",
        "replicas": {"static": [e.url for e in engines]},
        "policy": "round-robin",
        "retries": {"max_attempts": 1},
        "scrape": {"enabled": False},
    }
    state = {"backend": "redis", "url": REDIS_URL, "key_prefix": key_prefix, "timeout_s": 2.0}
    first, second = (gateways(gateway_settings([pool], state=state)) for _ in range(2))

    async def send(gateway: ServerThread, text: str) -> str:
        body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
            response = await client.post("/v1/chat/completions", json=body)
        return "ok" if response.status_code == 200 else response.headers.get("x-gateway-reject-reason", "?")

    for gateway in (first, second):  # each sees both replicas serve others
        assert [asyncio.run(send(gateway, f"good {i}")) for i in range(4)] == ["ok"] * 4
    assert asyncio.run(send(first, f"{MARKER} shared")) == "upstream_status"
    quarantined = second.app.state.metrics.quarantine_total
    time.sleep(SYNC_INTERVAL_S + 0.5)  # the second gateway's mirror has the sighting
    assert asyncio.run(send(second, f"{MARKER} shared")) == "request_quarantined"
    assert quarantined.labels("m", "quarantined")._value.get() == 1
    assert Counter(e.app.counters.poisoned_injected for e in engines) == Counter({1: 2}), "one try on each"
    time.sleep(SYNC_INTERVAL_S + 0.5)
    assert asyncio.run(send(first, f"{MARKER} shared")) == "request_quarantined", "refused at arrival"
    assert sum(e.app.counters.poisoned_injected for e in engines) == 2, "no engine saw it again"
