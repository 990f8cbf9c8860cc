"""`Idempotency-Key` on the real Redis: the store across simulated instances (one `RedisBackend` each),
then two real gateway apps sharing one Redis in front of one mock engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from core.clock import FakeClock
from core.state_outage import FailureMode, RedisOperation
from gateway.base.errors import BadRequest, StateUnavailable
from gateway.config.settings import IdempotencySettings
from gateway.proxy.stores.idempotency import StoredResponse, body_digest
from gateway.proxy.stores.idempotency_redis import RedisIdempotencyStore, encode_response, idempotency_store
from mock_engine.faults import FaultSettings
from tests.integration.conftest import MODEL, pool
from tests.servers import ServerThread, gateway_settings
from tests.waiting import eventually

from .conftest import CLOSED_PORT_URL, REDIS_URL, BackendFactory, TcpProxy

pytestmark = pytest.mark.redis

KEY = ("m", "client", "order-42")
DIGEST = body_digest(b'{"prompt": "charge the card"}')
OK = StoredResponse(200, [(b"content-type", b"application/json")], b'{"id":"cmpl-1"}')


def stores(make_backend: BackendFactory, count: int = 2, **kwargs: Any) -> list[RedisIdempotencyStore]:
    """One store per simulated gateway instance, each on its own backend (own connections)."""
    return [RedisIdempotencyStore(make_backend(), **kwargs) for _ in range(count)]


async def entry_key(raw_redis: Redis, key_prefix: str) -> str:
    """The one idempotency entry under the test's prefix."""
    [entry] = [k async for k in raw_redis.scan_iter(match=f"{key_prefix}idem:*")]
    return str(entry)


async def waiting_on(raw_redis: Redis, key_prefix: str, count: int) -> None:
    """Until `count` waiters are subscribed to the entry's completion channel (they wait for it)."""
    channel = await entry_key(raw_redis, key_prefix) + ":done"

    async def subscribed() -> bool:
        [(_, subscribers)] = await raw_redis.pubsub_numsub(channel)
        return int(subscribers) == count

    await eventually(subscribed, what=f"{count} waiter(s) subscribed to {channel}")


async def expired(raw_redis: Redis, entry: str) -> None:
    """Until Redis has expired `entry` (its own clock: `EXISTS` expires a key past its PTTL)."""

    async def gone() -> bool:
        return await raw_redis.exists(entry) == 0

    await eventually(gone, what=f"{entry} expired")


async def test_leader_then_replay_on_another_instance_and_a_different_body_is_a_bad_request(
    make_backend: BackendFactory,
) -> None:
    one, two = stores(make_backend)
    assert await one.claim(KEY, DIGEST) is None
    await one.complete(KEY, OK)
    assert await two.claim(KEY, DIGEST) == OK
    with pytest.raises(BadRequest):
        await two.claim(KEY, body_digest(b"another body"))


async def test_concurrent_duplicates_on_both_instances_wake_on_completion(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    one, two = stores(make_backend)  # lease 10 s: only the published completion can wake them early
    assert await one.claim(KEY, DIGEST) is None
    waiters = [asyncio.create_task(store.claim(KEY, DIGEST)) for store in (one, two, two)]
    await waiting_on(raw_redis, key_prefix, 3)
    assert not any(w.done() for w in waiters)
    completed_s = time.monotonic()
    await one.complete(KEY, OK)
    assert await asyncio.gather(*waiters) == [OK, OK, OK]
    assert time.monotonic() - completed_s < 0.5


async def test_a_failed_leader_hands_over_to_a_waiter(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    one, two = stores(make_backend)
    assert await one.claim(KEY, DIGEST) is None
    waiter = asyncio.create_task(two.claim(KEY, DIGEST))
    await waiting_on(raw_redis, key_prefix, 1)
    await one.complete(KEY, None)
    assert await asyncio.wait_for(waiter, 1.0) is None, "the waiter on the other instance now leads"
    await two.complete(KEY, OK)
    assert await one.claim(KEY, DIGEST) == OK


async def test_a_dead_leader_is_replaced_when_its_lease_expires(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    (store,) = stores(make_backend, 1)
    assert await store.claim(("m", "c", "probe"), DIGEST) is None  # learn the entry key's shape
    [probe] = [k async for k in raw_redis.scan_iter(match=f"{key_prefix}idem:*")]
    await store.complete(("m", "c", "probe"), None)
    # An instance that claimed, then died: pending, never renewed, never completed.
    await raw_redis.hset(probe, mapping={"digest": DIGEST.hex(), "state": "pending", "token": "dead"})
    await raw_redis.pexpire(probe, 300)
    started_s = time.monotonic()
    assert await store.claim(("m", "c", "probe"), DIGEST) is None
    assert 0.2 < time.monotonic() - started_s < 1.0


async def test_a_live_leader_keeps_its_claim_past_the_lease(make_backend: BackendFactory) -> None:
    one, two = stores(make_backend, lease_s=0.3)
    assert await one.claim(KEY, DIGEST) is None
    waiter = asyncio.create_task(two.claim(KEY, DIGEST))
    # Deliberate idle period, the behaviour under test: more than 3 leases pass (renewed every
    # lease / 3); nothing happens that could be waited for instead.
    await asyncio.sleep(1.0)
    assert not waiter.done()
    await one.complete(KEY, OK)
    assert await asyncio.wait_for(waiter, 1.0) == OK


async def test_oversized_responses_are_not_stored_and_entries_expire(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    (small,) = stores(make_backend, 1, max_stored_bytes=10)
    assert await small.claim(KEY, DIGEST) is None
    await small.complete(KEY, OK)
    assert await small.claim(KEY, DIGEST) is None, "not stored: the duplicate runs"
    await small.complete(KEY, None)
    (short,) = stores(make_backend, 1, ttl_s=0.2)
    assert await short.claim(KEY, DIGEST) is None
    await short.complete(KEY, OK)
    assert await short.claim(KEY, DIGEST) == OK
    entry = await entry_key(raw_redis, key_prefix)
    assert 0 < await raw_redis.pttl(entry) <= 200, "done: kept for ttl_s"
    await expired(raw_redis, entry)
    assert await short.claim(KEY, body_digest(b"new body after expiry")) is None


async def test_the_idempotency_settings_reach_the_redis_store(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    full = encode_response(OK, 1 << 20)
    assert full is not None
    exact_bytes = len(full[1]) + len(full[3].encode())  # the stored form: headers JSON + body
    settings = IdempotencySettings(ttl_s=1.0, lease_s=0.3, max_stored_bytes=exact_bytes)
    one, two = (idempotency_store(make_backend(), FakeClock(), settings) for _ in range(2))
    assert isinstance(one, RedisIdempotencyStore)
    assert await one.claim(KEY, DIGEST) is None
    [entry] = [k async for k in raw_redis.scan_iter(match=f"{key_prefix}idem:*")]
    assert 0 < await raw_redis.pttl(entry) <= 300, "pending: held for lease_s"
    await one.complete(KEY, OK)
    assert 500 < await raw_redis.pttl(entry) <= 1000, "done: kept for ttl_s (not the lease)"
    assert await two.claim(KEY, DIGEST) == OK, "exactly max_stored_bytes: stored"
    await expired(raw_redis, entry)
    assert await two.claim(KEY, DIGEST) is None, "past ttl_s: the key runs again"

    await two.complete(KEY, StoredResponse(200, OK.headers, OK.body + b" "))
    assert await one.claim(KEY, DIGEST) is None, "one byte over max_stored_bytes: not stored"
    one._leading[KEY].renewal.cancel()  # this leader now dies: never renewed, never completed
    started_s = time.monotonic()
    assert await two.claim(KEY, DIGEST) is None, "the lease ran out: the waiter leads"
    assert time.monotonic() - started_s < 1.0
    await two.complete(KEY, None)


async def test_unreachable_redis_follows_on_error_and_is_counted(make_backend: BackendFactory) -> None:
    seen: list[RedisOperation] = []
    fail_open = RedisIdempotencyStore(
        make_backend(CLOSED_PORT_URL, on_error=FailureMode.FAIL_OPEN, on_error_callback=seen.append)
    )
    assert await fail_open.claim(KEY, DIGEST) is None, "runs as if no key was given"
    await fail_open.complete(KEY, OK)  # nothing was claimed: nothing to do
    assert seen == [RedisOperation.IDEMPOTENCY_CLAIM]
    fail_closed = RedisIdempotencyStore(make_backend(CLOSED_PORT_URL, on_error=FailureMode.FAIL_CLOSED))
    with pytest.raises(StateUnavailable) as refused:
        await fail_closed.claim(KEY, DIGEST)
    assert refused.value.status == 503 and refused.value.retry_after_s is not None


async def test_redis_lost_while_waiting_applies_on_error(
    make_backend: BackendFactory, redis_proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[RedisOperation] = []
    leader = RedisIdempotencyStore(make_backend())
    backend = make_backend(redis_proxy.url, on_error_callback=seen.append)
    answered: list[RedisOperation] = []
    run = backend.run

    async def recorded_run(operation: RedisOperation, *args: Any) -> Any:
        reply = await run(operation, *args)
        answered.append(operation)
        return reply

    monkeypatch.setattr(backend, "run", recorded_run)
    waiting = RedisIdempotencyStore(backend)
    assert await leader.claim(KEY, DIGEST) is None
    waiter = asyncio.create_task(waiting.claim(KEY, DIGEST))
    # The first claim answers pending; the second is the re-check after the subscription was confirmed,
    # right before the waiter blocks on the channel (no await in between): from then on it is waiting.
    await eventually(
        lambda: answered.count(RedisOperation.IDEMPOTENCY_CLAIM) == 2, what="the waiter waits on the channel"
    )
    await redis_proxy.stop()
    assert await asyncio.wait_for(waiter, 2.0) is None, "fail_open: served without the key"
    assert RedisOperation.IDEMPOTENCY_WAIT in seen
    await leader.complete(KEY, None)


# --- two gateway apps, one Redis, one engine ------------------------------------------------------------

GatewayFactory = Callable[[dict[str, Any]], ServerThread]
BODY = {"model": MODEL, "prompt": "charge the card", "max_tokens": 20}
HEADERS = {"idempotency-key": "order-42"}


def redis_gateway(
    gateways: GatewayFactory, engine: ServerThread, key_prefix: str, url: str = REDIS_URL, **state: Any
) -> ServerThread:
    settings = gateway_settings(
        [pool([engine])], state={"backend": "redis", "url": url, "key_prefix": key_prefix, **state}
    )
    return gateways(settings)


async def post(gateway: ServerThread, body: dict[str, Any] = BODY) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        return await client.post("/v1/completions", json=body, headers=HEADERS)


async def test_two_gateways_generate_once_for_concurrent_and_later_duplicates(
    mock_engines: Callable[..., ServerThread], gateways: GatewayFactory, key_prefix: str, raw_redis: Redis
) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=10)
    both = [redis_gateway(gateways, engine, key_prefix) for _ in range(2)]
    burst = await asyncio.gather(*(post(both[i % 2]) for i in range(5)))
    later = [await post(gateway) for gateway in both]
    assert [r.status_code for r in [*burst, *later]] == [200] * 7
    assert len({r.json()["id"] for r in [*burst, *later]}) == 1, "every duplicate sees the same completion"
    assert engine.app.counters.started == 1
    replays = [r.headers.get("x-gateway-idempotent-replay") == "true" for r in [*burst, *later]]
    assert sum(replays) == 6 and all(replays[5:])
    other = await post(both[1], {**BODY, "prompt": "another order"})
    assert other.status_code == 400 and other.headers["x-gateway-reject-reason"] == "bad_request"


async def test_a_failed_leader_stores_nothing_and_the_next_duplicate_runs(
    mock_engines: Callable[..., ServerThread], gateways: GatewayFactory, key_prefix: str, raw_redis: Redis
) -> None:
    engine = mock_engines(model=MODEL, faults=FaultSettings(error_rate=1.0))
    one, two = (redis_gateway(gateways, engine, key_prefix) for _ in range(2))
    failed = await post(one)
    assert failed.status_code == 500 and engine.app.counters.failed_injected >= 1
    assert [k async for k in raw_redis.scan_iter(match=f"{key_prefix}idem:*")] == []
    engine.app.set_faults_threadsafe({"error_rate": 0.0})
    retried = await post(two)
    assert retried.status_code == 200 and "x-gateway-idempotent-replay" not in retried.headers
    assert engine.app.counters.started == 1


@pytest.mark.parametrize("on_error", ["fail_open", "fail_closed"])
async def test_redis_down_serves_or_refuses_per_on_error(
    mock_engines: Callable[..., ServerThread], gateways: GatewayFactory, key_prefix: str, on_error: str
) -> None:
    engine = mock_engines(model=MODEL)
    gateway = redis_gateway(gateways, engine, key_prefix, url=CLOSED_PORT_URL, on_error=on_error)
    answers = [await post(gateway) for _ in range(2)]
    if on_error == "fail_open":
        assert [a.status_code for a in answers] == [200, 200]
        assert not any("x-gateway-idempotent-replay" in a.headers for a in answers)
    else:
        assert [a.status_code for a in answers] == [503, 503]
        assert answers[0].headers["x-gateway-reject-reason"] == "state_unavailable"
        assert "retry-after" in answers[0].headers
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'llm_gateway_state_errors_total{operation="idempotency_claim"} 2.0' in metrics
