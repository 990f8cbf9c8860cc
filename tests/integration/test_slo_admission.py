"""Queue waits bounded by the TTFT objective, through real servers: an interactive request that cannot
get a slot within half its TTFT objective is refused with 429 and Retry-After, a batch request waits
its class's full max wait and is served, and nothing stays in flight."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings, wait_until

CHAT = "/v1/chat/completions"


def _body(max_tokens: int = 2) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


def test_an_interactive_request_is_refused_once_it_cannot_meet_its_ttft_objective(
    mock_engines, gateways
) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=20)  # 40 tokens hold the only slot ~0.8 s
    slo = {"ttft_s": 0.4, "tpot_s": None}  # interactive waits at most 0.2 s in the queue
    gateway = gateways(gateway_settings([pool([engine], max_concurrency_per_replica=1, slo=slo)]))

    async def scenario() -> tuple[httpx.Response, httpx.Response, float, httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
            holder = asyncio.create_task(client.post(CHAT, json=_body(40)))
            assert await asyncio.to_thread(
                wait_until, lambda: gateway.app.state.registry.total_inflight() == 1
            )
            started = time.perf_counter()
            refused = await client.post(CHAT, json=_body())
            waited_s = time.perf_counter() - started
            batch = await client.post(CHAT, json=_body(), headers={"x-gateway-priority": "batch"})
            return await holder, refused, waited_s, batch

    holder, refused, waited_s, batch = asyncio.run(scenario())
    assert holder.status_code == 200
    assert refused.status_code == 429
    assert refused.headers["x-gateway-reject-reason"] in {"queue_timeout", "queue_full"}
    assert int(refused.headers["retry-after"]) >= 1
    assert waited_s < 0.6, "refused at its bound (0.2 s), not after the class's 10 s"
    assert batch.status_code == 200, "the lowest class may wait: its wait is not bounded by the TTFT SLO"
    assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)
