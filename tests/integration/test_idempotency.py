"""Idempotency-Key through a real gateway: concurrent and later duplicates never generate twice."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings


def test_duplicates_get_the_first_response_and_the_engine_generates_once(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=10)
    gateway = gateways(gateway_settings([pool([engine])]))
    body = {"model": MODEL, "prompt": "charge the card", "max_tokens": 20}
    headers = {"idempotency-key": "order-42"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body, headers=headers) for _ in range(5))
            )

    responses = asyncio.run(burst())
    later = httpx.post(gateway.url + "/v1/completions", json=body, headers=headers)
    assert {r.status_code for r in [*responses, later]} == {200}
    assert len({r.json()["id"] for r in [*responses, later]}) == 1, "every duplicate sees the same completion"
    assert engine.app.counters.started == 1
    assert sum(r.headers.get("x-gateway-idempotent-replay") == "true" for r in [*responses, later]) == 5
    other = httpx.post(gateway.url + "/v1/completions", json={**body, "prompt": "x"}, headers=headers)
    assert other.status_code == 400 and other.headers["x-gateway-reject-reason"] == "bad_request"


def test_a_configured_size_limit_stops_replays_through_the_gateway(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL)
    gateway = gateways(gateway_settings([pool([engine])], idempotency={"max_stored_bytes": 10}))
    body = {"model": MODEL, "prompt": "charge the card", "max_tokens": 5}
    headers = {"idempotency-key": "order-43"}
    answers = [httpx.post(gateway.url + "/v1/completions", json=body, headers=headers) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert not any("x-gateway-idempotent-replay" in a.headers for a in answers)
    assert engine.app.counters.started == 2, "over max_stored_bytes: nothing stored, the duplicate ran"


def test_a_key_is_scoped_by_endpoint(mock_engines, gateways) -> None:
    """The same Idempotency-Key on chat and then on completions names two requests, not a reuse."""
    engine = mock_engines(model=MODEL)
    gateway = gateways(gateway_settings([pool([engine])]))
    headers = {"idempotency-key": "order-44"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    completion = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    first = httpx.post(gateway.url + "/v1/chat/completions", json=chat, headers=headers)
    second = httpx.post(gateway.url + "/v1/completions", json=completion, headers=headers)
    assert (first.status_code, second.status_code) == (200, 200), second.text
    assert second.json()["object"] == "text_completion"
    assert "x-gateway-idempotent-replay" not in second.headers
    assert engine.app.counters.started == 2
