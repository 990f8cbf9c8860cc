"""The shared prefix index on the real Redis: the sync script (publish, read the others' records after the
last one read, replay for a new instance, the stream's bounds) and two real gateways (uvicorn on
127.0.0.1) in front of the same engines, where a prefix first sent through one instance is routed by
the other to the same replica — and requests are still served while Redis is away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from redis.asyncio import Redis

from gateway.api.request_parsing import Endpoint, parse_request
from gateway.base.metrics import GatewayMetrics
from gateway.fleet.prefix_sharing import PrefixIndexSharing, SharingMetrics
from router.keys import build_routing_request
from router.prefix_index import PrefixIndex, policy_prefix_index
from tests.servers import ServerThread, gateway_settings, wait_until

from .conftest import REDIS_URL, BackendFactory, TcpProxy

pytestmark = pytest.mark.redis

MODEL = "shared-model"
QUESTIONS = 6


def sharing(
    backend: Any, name: str, index: PrefixIndex, members: tuple[str, ...] = ("r0", "r1")
) -> PrefixIndexSharing:
    return PrefixIndexSharing(
        backend, {"pool": index}, lambda pool: members, SharingMetrics(GatewayMetrics()), instance_id=name
    )


async def test_records_reach_the_other_instances_in_order_never_their_author(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str
) -> None:
    one, two = PrefixIndex(), PrefixIndex()
    a, b = sharing(make_backend(), "a", one), sharing(make_backend(), "b", two)
    one.record("r0", (1, 2, 3))
    await a.sync()
    one.record("r1", (1, 2, 3))  # the same prefix moved: the later record wins on b too
    one.record("r1", (7, 8))
    await a.sync()
    two.record("r0", (50,))
    await b.sync()
    assert two.matched_blocks("r0", (1, 2, 3)) == 3 and two.matched_blocks("r1", (1, 2, 3)) == 3
    assert two.replica_ids() == ("r0", "r1"), "a's records are merged in the order a made them"
    await a.sync()
    assert one.matched_blocks("r0", (50,)) == 1 and one.blocks("r0") == 4  # b's record; a's own not twice
    key = f"{key_prefix}prefix-index"
    assert await raw_redis.xlen(key) == 3
    assert 0 < await raw_redis.pttl(key) <= 600_000


async def test_a_new_instance_replays_the_retained_records_and_a_late_one_catches_up(
    make_backend: BackendFactory,
) -> None:
    one = PrefixIndex()
    a = sharing(make_backend(), "a", one)
    for n in range(3):
        one.record("r0", (100 + n,))
        await a.sync()
    late, fresh = PrefixIndex(), PrefixIndex()
    await sharing(make_backend(), "late", late).sync()  # starts REPLAY_S back: sees all three
    assert [late.matched_blocks("r0", (100 + n,)) for n in range(3)] == [1, 1, 1]
    c = sharing(make_backend(), "c", fresh)
    await c.sync()
    one.record("r1", (200,))
    await a.sync()
    one.record("r1", (201,))
    await a.sync()
    await c.sync()  # away for two batches: resumes after the last entry it read
    assert fresh.matched_blocks("r1", (200,)) == 1 and fresh.matched_blocks("r1", (201,)) == 1


async def test_the_stream_is_capped(
    make_backend: BackendFactory, raw_redis: Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.fleet.prefix_sharing.STREAM_MAX_BATCHES", 10)
    one = PrefixIndex()
    a = sharing(make_backend(), "a", one)
    for n in range(300):
        one.record("r0", (n + 1,))
        await a.sync()
    assert await raw_redis.xlen(f"{key_prefix}prefix-index") <= 110  # MAXLEN ~ trims whole 100-entry nodes


def _settings(engines: list[ServerThread], url: str, key_prefix: str, share: bool = True) -> dict[str, Any]:
    pool = {
        "model": MODEL,
        "engine": "vllm",
        "replicas": {"static": [e.url for e in engines]},
        "policy": "prefix-index",
        "scrape": {"enabled": False},
    }
    state = {"backend": "redis", "url": url, "key_prefix": key_prefix, "share_prefix_index": share}
    return gateway_settings([pool], state=state)


def _ask(gateway: ServerThread, system: str, question: str) -> tuple[str, str]:
    """(replica, branch) of one chat completion through `gateway` with the official client."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2,
        )
    route = dict(part.split("=", 1) for part in raw.headers["x-gateway-route"].split("; "))
    assert raw.parse().choices
    return raw.headers["x-gateway-replica"], route["branch"]


def _knows(gateway: ServerThread, replica_id: str, system: str, question: str) -> bool:
    """Whether `gateway`'s prefix index places this chat's prompt prefix on `replica_id`."""
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    parsed = parse_request(Endpoint.CHAT, orjson.dumps(body))
    pool = gateway.app.state.registry.pools[MODEL]
    index = policy_prefix_index(pool.policy)
    assert index is not None
    routing = build_routing_request(MODEL, parsed.prompt_text, pool.key_settings)
    return index.matched_blocks(replica_id, routing.prefix_hashes) > 0


def _system(n: int) -> str:
    return f"System prompt number {n} for the shared-index test, with its rules. " * 12


def _sample(gateway: ServerThread, name: str, labels: dict[str, str] | None = None) -> float:
    metrics: GatewayMetrics = gateway.app.state.metrics
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def _applied(gateway: ServerThread) -> float:
    return _sample(gateway, "llm_gateway_prefix_index_records_total", {"direction": "applied"})


@pytest.mark.parametrize("share", [True, False])
def test_a_prefix_sent_through_one_instance_is_routed_by_the_other_to_the_same_replica(
    mock_engines: Callable[..., ServerThread],
    gateways: Callable[[dict[str, Any]], ServerThread],
    key_prefix: str,
    raw_redis: Redis,
    share: bool,
) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(4)]
    a, b = (gateways(_settings(engines, REDIS_URL, key_prefix, share)) for _ in range(2))
    first = [_ask(a, _system(n), "first question") for n in range(QUESTIONS)]
    assert [branch for _, branch in first] == ["prefix_miss"] * QUESTIONS
    if share:
        assert wait_until(lambda: _applied(b) >= QUESTIONS, timeout_s=5)
    then = [_ask(b, _system(n), "another question") for n in range(QUESTIONS)]
    if share:
        assert then == [(replica, "prefix_match") for replica, _ in first]
    else:
        assert [branch for _, branch in then] == ["prefix_miss"] * QUESTIONS
        assert _applied(b) == 0 and _sample(b, "llm_gateway_prefix_index_sharing_up") == 0.0


async def test_requests_are_served_while_redis_is_away_and_sharing_resumes(
    mock_engines: Callable[..., ServerThread],
    gateways: Callable[[dict[str, Any]], ServerThread],
    key_prefix: str,
    raw_redis: Redis,
    redis_proxy: TcpProxy,
) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(3)]
    a, b = (gateways(_settings(engines, redis_proxy.url, key_prefix)) for _ in range(2))

    async def ask(gateway: ServerThread, n: int, question: str) -> tuple[str, str]:
        return await asyncio.to_thread(_ask, gateway, _system(n), question)

    async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        return await asyncio.to_thread(wait_until, predicate, timeout_s)

    await redis_proxy.stop()
    for n in range(4):  # every request is answered, each instance on its own index
        replica, _ = await ask(a, n, "while away")
        assert (await ask(a, n, "again"))[0] == replica
        await ask(b, n, "while away")
    for gateway in (a, b):
        assert await until(lambda g=gateway: _sample(g, "llm_gateway_prefix_index_sharing_up") == 0.0)
        errors = _sample(gateway, "llm_gateway_state_errors_total", {"operation": "prefix_index_sync"})
        assert errors >= 1

    await redis_proxy.start()
    for gateway in (a, b):  # both back: b applies only what a publishes from now on
        assert await until(lambda g=gateway: _sample(g, "llm_gateway_prefix_index_sharing_up") == 1.0)
    replica, _ = await ask(a, 99, "after the outage")
    # records a made while Redis was away may still be published first: wait for this prompt's own
    assert await until(lambda: _knows(b, replica, _system(99), "and through the other"))
    assert await ask(b, 99, "and through the other") == (replica, "prefix_match")
