"""State affinity across gateway instances: the response id → replica map in Redis, so a conversation
started through one gateway continues through another on the replica that holds it; and the store's
own behaviour on Redis (TTL, Redis down with fail_open / fail_closed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest
import redis
from redis.asyncio import Redis

from core.clock import FakeClock
from core.state_outage import FailureMode
from gateway.base.errors import StateUnavailable
from gateway.proxy.stores.response_state import MemoryResponseState, RedisResponseState, ResponseLocation
from tests.servers import ServerThread, free_port, gateway_settings

from .conftest import REDIS_URL, BackendFactory

pytestmark = pytest.mark.redis

MODEL = "shared-model"
HERE = ResponseLocation(MODEL, "127.0.0.1:1")


async def test_the_map_is_shared_and_expires_in_redis(make_backend: BackendFactory, raw_redis: Redis) -> None:
    first = RedisResponseState(make_backend(), MemoryResponseState(FakeClock()), ttl_s=0.2)
    second = RedisResponseState(make_backend(), MemoryResponseState(FakeClock()), ttl_s=0.2)
    await first.put("resp_a", HERE)
    assert await second.get("resp_a") == HERE, "another instance reads it"
    assert await second.get("resp_b") is None
    ttl_ms = [await raw_redis.pttl(key) async for key in raw_redis.scan_iter(match="*resp:resp_a")]
    assert len(ttl_ms) == 1 and 0 < ttl_ms[0] <= 200


async def test_redis_down_reads_the_local_map_or_refuses(make_backend: BackendFactory) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    fail_open = RedisResponseState(
        make_backend(down, on_error=FailureMode.FAIL_OPEN), MemoryResponseState(FakeClock())
    )
    await fail_open.put("resp_a", HERE)  # Redis unreachable: kept locally
    assert await fail_open.get("resp_a") == HERE
    assert await fail_open.get("resp_b") is None
    fail_closed = RedisResponseState(
        make_backend(down, on_error=FailureMode.FAIL_CLOSED), MemoryResponseState(FakeClock())
    )
    with pytest.raises(StateUnavailable):
        await fail_closed.get("resp_a")


async def test_a_deleted_id_is_gone_for_every_instance(
    make_backend: BackendFactory, raw_redis: Redis
) -> None:
    first = RedisResponseState(make_backend(), MemoryResponseState(FakeClock()))
    second = RedisResponseState(make_backend(), MemoryResponseState(FakeClock()))
    await first.put("resp_a", HERE)
    await first.put("resp_b", HERE)
    await second.delete("resp_a")
    assert await first.get("resp_a") is None, "the shared key is gone, whatever the local copy held"
    assert await second.get("resp_b") == HERE
    assert [key async for key in raw_redis.scan_iter(match="*resp:resp_a")] == []


async def test_a_delete_with_redis_down_never_fails_and_drops_the_local_copy(
    make_backend: BackendFactory,
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    for mode in (FailureMode.FAIL_OPEN, FailureMode.FAIL_CLOSED):
        local = MemoryResponseState(FakeClock())
        state = RedisResponseState(make_backend(down, on_error=mode), local)
        await state.put("resp_a", HERE)
        await state.delete("resp_a")  # the engine deleted it already: no error to report
        assert local.get_now("resp_a") is None, mode


def test_a_response_deleted_through_one_instance_is_not_found_through_another(
    mock_engines: Callable[..., ServerThread],
    gateways: Callable[[dict[str, Any]], ServerThread],
    key_prefix: str,
) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(2)]
    pool = {"model": MODEL, "replicas": {"static": [e.url for e in engines]}, "policy": "least-load"}
    state = {"backend": "redis", "url": REDIS_URL, "key_prefix": key_prefix}
    instances = [gateways(gateway_settings([pool], state=state)) for _ in range(2)]
    first, second = (
        openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0, timeout=10) for g in instances
    )
    gone = first.responses.create(model=MODEL, input="delete me", max_output_tokens=3).id
    kept = first.responses.create(model=MODEL, input="keep me", max_output_tokens=3).id
    second.responses.delete(gone)
    # The record is dropped before the delete's last byte (Reply.before_end): gone once the client has it.
    shared = redis.Redis.from_url(REDIS_URL)
    try:
        assert not shared.exists(f"{key_prefix}resp:{gone}"), "the shared key is gone"
        assert shared.exists(f"{key_prefix}resp:{kept}")
    finally:
        shared.close()
    for client in (first, second):
        with pytest.raises(openai.NotFoundError) as raised:
            client.responses.retrieve(gone)
        assert raised.value.response.headers["x-gateway-reject-reason"] == "response_not_found"
        assert "x-gateway-replica" not in raised.value.response.headers
        assert client.responses.retrieve(kept).id == kept


def test_a_conversation_continues_through_another_gateway_instance(
    mock_engines: Callable[..., ServerThread],
    gateways: Callable[[dict[str, Any]], ServerThread],
    key_prefix: str,
) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(3)]
    pool = {"model": MODEL, "replicas": {"static": [e.url for e in engines]}, "policy": "least-load"}
    state = {"backend": "redis", "url": REDIS_URL, "key_prefix": key_prefix}
    instances = [gateways(gateway_settings([pool], state=state)) for _ in range(2)]
    clients = [
        openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0, timeout=10) for g in instances
    ]
    for start in range(4):  # conversations started on either instance, continued on alternating ones
        raw = clients[start % 2].responses.with_raw_response.create(
            model=MODEL, input=f"chat {start}", max_output_tokens=3
        )
        response_id, replica = raw.parse().id, raw.headers["x-gateway-replica"]
        for turn in range(1, 4):
            client = clients[(start + turn) % 2]
            raw = client.responses.with_raw_response.create(
                model=MODEL, input="go on", max_output_tokens=3, previous_response_id=response_id
            )
            assert raw.headers["x-gateway-replica"] == replica
            response_id = raw.parse().id
        other = clients[(start + 1) % 2].responses.with_raw_response.retrieve(response_id)
        assert other.headers["x-gateway-replica"] == replica
