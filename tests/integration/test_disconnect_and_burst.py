"""Nothing is lost: client disconnects abort upstream work, and in-flight counts return to zero."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from tests.integration.conftest import MODEL, Fleet, pool
from tests.servers import ServerThread, gateway_settings, wait_until

ERROR_CODES = {"bad_request", "model_not_found"}


def _slow_fleet(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> Fleet:
    engine = mock_engines(model=MODEL, first_token_delay_ms=5, token_delay_ms=20)
    return Fleet(gateways(gateway_settings([pool([engine])])), [engine])


def test_client_disconnect_mid_stream_aborts_upstream_within_1s(mock_engines, gateways) -> None:
    fleet = _slow_fleet(mock_engines, gateways)
    engine_counters = fleet.engines[0].app.counters
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 2000,
        "stream": True,
    }
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", fleet.gateway.url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [next(lines) for _ in range(4)]
        assert any("content" in line for line in received)
        assert fleet.inflight() == {fleet.engines[0].url.removeprefix("http://"): 1}
    left_at = time.monotonic()
    assert wait_until(lambda: engine_counters.aborted == 1, 1.0), "engine did not see the abort within 1 s"
    abort_latency_s = time.monotonic() - left_at
    assert wait_until(lambda: set(fleet.inflight_gauge().values()) == {0.0}, 1.0)
    assert set(fleet.inflight().values()) == {0}
    assert engine_counters.finished == 0 and abort_latency_s < 1.0


def test_client_disconnect_while_waiting_for_a_non_streamed_answer(mock_engines, gateways) -> None:
    fleet = _slow_fleet(mock_engines, gateways)
    body = {"model": MODEL, "prompt": "long", "max_tokens": 2000}
    with httpx.Client(timeout=0.3) as client, contextlib.suppress(httpx.ReadTimeout):
        client.post(fleet.gateway.url + "/v1/completions", json=body)
    assert wait_until(lambda: fleet.engines[0].app.counters.aborted == 1, 1.0)
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}, 1.0)
    outcomes = fleet.app.state.metrics.requests_total.collect()[0].samples
    assert any(s.labels["outcome"] == "client_disconnect" and s.value == 1 for s in outcomes)


async def _one(client: httpx.AsyncClient, url: str, kind: str, rng: random.Random) -> str:
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"q{rng.random()}"}],
        "max_tokens": rng.randint(1, 30),
    }
    if kind == "malformed":
        response = await client.post(url + "/v1/chat/completions", content=b'{"model": ')
        return response.headers["x-gateway-reject-reason"]
    if kind == "unknown_model":
        response = await client.post(url + "/v1/chat/completions", json={**chat, "model": "missing"})
        return response.headers["x-gateway-reject-reason"]
    if kind == "plain":
        response = await client.post(url + "/v1/chat/completions", json=chat)
        assert response.json()["usage"]["completion_tokens"] == chat["max_tokens"]
        return str(response.status_code)
    async with client.stream("POST", url + "/v1/chat/completions", json={**chat, "stream": True}) as response:
        assert response.status_code == 200
        lines = []
        async for line in response.aiter_lines():
            lines.append(line)
            if kind == "disconnect" and len(lines) >= 2:
                return "disconnected"
        assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
        return "stream_ok"


def test_burst_of_200_mixed_requests_all_end_and_inflight_returns_to_zero(fleet: Fleet) -> None:
    rng = random.Random(42)
    kinds = ["plain", "stream", "disconnect", "unknown_model", "malformed"]
    plan = [kinds[i % len(kinds)] for i in range(200)]
    rng.shuffle(plan)

    async def run() -> list[str]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(timeout=20, limits=limits) as client:
            return await asyncio.gather(*(_one(client, fleet.gateway.url, k, rng) for k in plan))

    results = asyncio.run(run())
    assert len(results) == 200
    counts = Counter(results)
    assert counts == {
        "200": 40,
        "stream_ok": 40,
        "disconnected": 40,
        "model_not_found": 40,
        "bad_request": 40,
    }
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}, 2.0), fleet.inflight()
    assert set(fleet.inflight_gauge().values()) == {0.0}
    engine_active = [e.app.counters.active for e in fleet.engines]
    assert wait_until(lambda: all(e.app.counters.active == 0 for e in fleet.engines), 2.0), engine_active
