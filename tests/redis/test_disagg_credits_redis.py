"""A disaggregated pool behind the real Redis: with `state.backend: redis` its sets' caps are slot credits
(`gateway.upstream.slot_credits`), and the pair queue (`gateway.proxy.disagg.admit`) must ask for them.
Real prefill and decode mock engines (vLLM legs), a real gateway, the official `openai` client."""

from __future__ import annotations

import asyncio
import concurrent.futures

import httpx
import openai
import pytest
from redis.asyncio import Redis

from mock_engine.disagg_params import Protocol, Role
from tests.disagg_fleet import disagg_engine, disagg_pool
from tests.redis.conftest import REDIS_URL
from tests.servers import gateway_settings, start_gateway, wait_until

pytestmark = pytest.mark.redis

MODEL = "m"
PROMPT = "the quick brown fox jumps over the lazy dog " * 3


async def test_pair_requests_get_credits_on_both_sets_and_give_them_back(
    key_prefix: str, raw_redis: Redis
) -> None:
    """Three requests at once against a decode cap of 1 and a prefill cap of 1, both held in Redis:
    every one is served in turn (before, none was granted a credit: the pair queue asked for nothing and
    each waited out its class's wait into a 429), neither engine ever ran two, and once idle past the
    linger every credit is back in Redis."""
    prefill = disagg_engine(MODEL, Role.PREFILL, Protocol.VLLM)
    decode = disagg_engine(MODEL, Role.DECODE, Protocol.VLLM)
    pool = disagg_pool(MODEL, Protocol.VLLM, [prefill.url], [decode.url], decode_cap=1)
    pool["disaggregation"]["prefill"]["max_concurrency_per_replica"] = 1
    state = {
        "backend": "redis",
        "url": REDIS_URL,
        "key_prefix": key_prefix,
        "timeout_s": 2.0,
        "replica_credit_linger_s": 0.2,
    }
    admission = {"classes": {"interactive": {"max_wait_s": 10}}, "default_priority": "interactive"}
    gateway = start_gateway(gateway_settings([pool], state=state, admission=admission))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=20)
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as threads:
            calls = [
                threads.submit(client.completions.create, model=MODEL, prompt=f"{PROMPT} {n}", max_tokens=20)
                for n in range(3)
            ]
            texts = [call.result().choices[0].text for call in calls]
        assert all(len(text.split()) == 20 for text in texts)
        for engine in (prefill, decode):
            assert httpx.get(f"{engine.url}/mock/stats").json()["max_active"] == 1
        registry = gateway.app.state.registry
        assert wait_until(lambda: registry.total_inflight() == 0)

        async def slot_leases() -> int:
            keys = [key async for key in raw_redis.scan_iter(match=f"{key_prefix}lease:replica:*@*")]
            return sum([await raw_redis.zcard(key) for key in keys])

        for _ in range(50):  # the linger is 0.2 s; the refiller gives idle credits back after it
            if await slot_leases() == 0:
                break
            await asyncio.sleep(0.1)
        assert await slot_leases() == 0, "every credit given back to Redis"
    finally:
        gateway.stop()
        prefill.stop()
        decode.stop()
