"""An engine slower than the TPOT objective at every batch, through real servers: the learned cap's cuts
do not lower its token latency, so they are undone (gateway/upstream/cut_check.py) — the replica keeps
the load it has instead of being throttled to `min_cap_per_replica` while the queue times out — and the
set point it steers to is exported. Both ways it happens: the load there before the first cut (a drain
is judged), and the load building after it (the cap at the floor from the first requests is probed)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings, wait_until

CHAT = "/v1/chat/completions"
CLIENTS = 32
TOKENS = 30  # 0.6 s a stream at 20 ms a token
RUN_S = 8.0
LATE_S = 3.0  # the last seconds, after the verdict


@pytest.mark.parametrize("ramp_s", [0.0, 2.0], ids=["load-first", "load-builds"])
def test_cuts_that_do_not_lower_the_token_latency_are_undone_and_the_load_is_served(
    mock_engines, gateways, ramp_s: float
) -> None:
    engine = mock_engines(model=MODEL, first_token_delay_ms=5, token_delay_ms=20)  # 20 ms at any batch
    slo = {"ttft_s": 2.0, "tpot_s": 0.01}  # an objective no batch reaches
    scrape = {"interval_s": 0.1, "timeout_s": 0.08}
    gateway = gateways(gateway_settings([pool([engine], slo=slo, scrape=scrape)]))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS}
    body["stream"] = True

    async def one(client: httpx.AsyncClient) -> int:
        async with client.stream("POST", CHAT, json=body) as response:
            chunks = [chunk async for chunk in response.aiter_text()]
        return response.status_code if "[DONE]" in "".join(chunks) or response.status_code != 200 else 0

    async def scenario() -> list[tuple[float, int]]:
        outcomes: list[tuple[float, int]] = []
        started = time.monotonic()

        async def loop(client: httpx.AsyncClient, index: int) -> None:
            await asyncio.sleep(ramp_s * index / CLIENTS)
            while time.monotonic() - started < RUN_S:
                status = await one(client)
                outcomes.append((time.monotonic() - started, status))
                if status != 200:
                    await asyncio.sleep(0.2)

        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30, limits=limits) as client:
            await asyncio.gather(*(loop(client, index) for index in range(CLIENTS)))
        return outcomes

    outcomes = asyncio.run(scenario())
    (replica,) = gateway.app.state.registry.all_replicas()
    assert replica.learned_cap is not None, "the objective broke: the cap engaged"
    assert replica.learned_cap >= CLIENTS // 2, "cut back to the floor (8) and held there"
    late = [status for at_s, status in outcomes if at_s >= RUN_S - LATE_S]
    assert late and all(status == 200 for status in late), late
    assert len(late) >= 0.5 * CLIENTS * LATE_S / (TOKENS * 0.02), "the late seconds served at the load"
    set_point_s = replica.learned_cap_set_point_s
    assert set_point_s is not None and set_point_s > 0.02, "steers to what the engine reaches, over 20 ms"
    exported = httpx.get(gateway.url + "/metrics").text
    assert f'llm_gateway_learned_cap_set_point_seconds{{replica="{replica.replica_id}"}}' in exported
    assert f'llm_gateway_learned_cap_held_at_floor{{replica="{replica.replica_id}"}} 0.0' in exported
    assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)
