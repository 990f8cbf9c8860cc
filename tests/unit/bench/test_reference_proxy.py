"""The reference proxy (bench/reference_proxy.py) passes requests through unchanged, relays streams, and
answers 502 when its upstream is gone; the CPU-per-request harness (bench/cpu_per_request.py) sums
blocks into per-server figures and ratios."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench.client import ClientOptions
from bench.cpu_per_request import Block, chat_bodies, closed_loop, ratio, render, summarize
from bench.fleet import free_port
from bench.lean_client import LeanClient
from bench.reference_proxy import make_app
from bench.workload import RequestSpec
from tests.servers import ServerThread

MODEL = "test-model"


@pytest.fixture
async def proxy(mock_engines: Callable[..., ServerThread]) -> AsyncIterator[str]:
    engine = mock_engines(model=MODEL, first_token_delay_ms=0, token_delay_ms=0)
    server = TestServer(make_app(engine.url))
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def test_a_non_streamed_answer_is_passed_through(proxy: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200 and r.headers["content-type"].startswith("application/json")
        answer = await r.json()
    assert answer["usage"]["completion_tokens"] == 4 and answer["model"] == MODEL
    async with aiohttp.ClientSession() as session, session.get(f"{proxy}/v1/models") as r:
        assert r.status == 200 and (await r.json())["data"][0]["id"] == MODEL


async def test_a_stream_is_relayed_to_its_end(proxy: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = (await r.read()).decode()
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    content = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert len([c for c in content if c]) == 5


async def test_an_upstream_error_status_is_passed_through(proxy: str) -> None:
    body = {"model": MODEL, "messages": "not a list"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy}/v1/chat/completions", json=body) as r,
    ):
        assert r.status >= 400


async def test_an_upstream_that_is_gone_is_a_502() -> None:
    server = TestServer(make_app(f"http://127.0.0.1:{free_port()}"))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/health")) as r:
            assert r.status == 502
    finally:
        await server.close()


async def test_the_closed_loop_client_sends_every_request(proxy: str) -> None:
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            bodies = chat_bodies(MODEL, max_tokens=3, stream=stream, variety=3)
            await closed_loop(session, proxy, bodies, requests=10, concurrency=4)


def test_blocks_sum_into_per_server_figures() -> None:
    blocks = [
        Block("gateway", 1000, 0.50, 0.49, 1.0),
        Block("reference", 1000, 0.10, 0.11, 0.5),
        Block("gateway", 1000, 0.70, 0.69, 1.0),
        Block("reference", 1000, 0.12, 0.11, 0.5),
    ]
    summary = summarize(blocks)
    assert summary["gateway"]["us_per_request"] == pytest.approx(600.0)
    assert (summary["gateway"]["min_us"], summary["gateway"]["max_us"]) == pytest.approx((500.0, 700.0))
    assert summary["reference"]["sched_us_per_request"] == pytest.approx(110.0)
    assert summary["reference"]["rps"] == pytest.approx(2000.0)
    assert ratio(summary, "gateway", "reference") == pytest.approx(600 / 110)
    assert "| gateway | 600 | 600 [500, 700] | 590 | 1000 | 5.45 |" in render(summary)


async def test_the_lean_client_records_ok_samples_through_the_proxy(proxy: str) -> None:
    spec = RequestSpec(messages=(("user", "ping"),), max_tokens=4)
    for stream in (False, True):
        client = LeanClient(ClientOptions(model=MODEL, stream=stream, timeout_s=10))
        try:
            samples = [await client.send(proxy, spec, i, 0.0, 0.0) for i in range(3)]
        finally:
            await client.aclose()
        assert all(s.ok and s.status == 200 and s.e2e_s > 0 for s in samples)
        assert all((s.ttft_s is None) == stream for s in samples)
    client = LeanClient(ClientOptions(model=MODEL, stream=False, timeout_s=10))
    dead_end = TestServer(make_app(f"http://127.0.0.1:{free_port()}"))
    await dead_end.start_server()
    try:
        refused = await client.send(str(dead_end.make_url("")).rstrip("/"), spec, 0, 0.0, 0.0)
        unreachable = await client.send(f"http://127.0.0.1:{free_port()}", spec, 1, 0.0, 0.0)
    finally:
        await client.aclose()
        await dead_end.close()
    assert (refused.ok, refused.status) == (False, 502)
    assert (unreachable.ok, unreachable.status, unreachable.error) == (False, 0, "ClientConnectorError")
