"""Mid-stream continuation and preemption, end to end: official openai client → gateway → mock engines.

A stream whose replica breaks after the first byte goes on from another replica; the client sees one
stream — one id, one role chunk, every token once, the same text an unbroken run gives, one usage total.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest

from mock_engine.faults import FaultSettings
from tests.integration.conftest import MODEL, pool
from tests.servers import ServerThread, gateway_settings
from tests.waiting import wait_for

TOKENS = 24
RETRIES = {"max_attempts": 3, "budget_ratio": 1.0, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
TIMEOUTS = {"ttft_s": 2, "idle_s": 2.0}
ADMIN_KEY = "preempt-admin"


def _prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"tell me story number {i}"}]


async def _stream(client: openai.AsyncOpenAI, i: int, tokens: int = TOKENS) -> tuple[str, list, object]:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=_prompt(i),
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
        seed=i,
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next(c.usage for c in chunks if c.usage is not None)
    return text, chunks, usage


def _check_one_stream(
    text: str, chunks: list, usage: object, expected_text: str, tokens: int = TOKENS
) -> None:
    assert text == expected_text, "the continued stream says what an unbroken run says"
    assert len({c.id for c in chunks}) == 1, "one id for the whole stream"
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    assert len(roles) == 1, "one role chunk"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == tokens, "every token once"
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]], "one usage total, last"
    assert usage.completion_tokens == tokens  # type: ignore[attr-defined]


async def _unbroken(url: str, count: int) -> list[str]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20) as client:
        return [text for text, _, _ in await asyncio.gather(*(_stream(client, i) for i in range(count)))]


async def _through(gateway_url: str, count: int) -> list[tuple[str, list, object]]:
    async with openai.AsyncOpenAI(
        base_url=gateway_url + "/v1", api_key="x", max_retries=0, timeout=20
    ) as client:
        return list(await asyncio.gather(*(_stream(client, i) for i in range(count))))


def _gateway(gateways, engines: list[ServerThread]) -> ServerThread:
    settings = pool(
        engines, policy="round-robin", retries=RETRIES, timeouts=TIMEOUTS, scrape={"enabled": False}
    )
    return gateways(gateway_settings([settings]))


@pytest.mark.parametrize(
    "fault",
    [FaultSettings(crash_after_tokens=6), FaultSettings(stall_after_tokens=6)],
    ids=["reset", "stall"],
)
def test_streams_broken_mid_way_complete_on_another_replica(mock_engines, gateways, fault) -> None:
    healthy = [mock_engines(model=MODEL, token_delay_ms=5) for _ in range(2)]
    broken = mock_engines(model=MODEL, token_delay_ms=5, faults=fault)
    gateway = _gateway(gateways, [broken, *healthy])
    expected = asyncio.run(_unbroken(healthy[0].url, 12))
    results = asyncio.run(_through(gateway.url, 12))
    for (text, chunks, usage), want in zip(results, expected, strict=True):
        _check_one_stream(text, chunks, usage, want)
    continued = gateway.app.state.metrics.stream_continuations_total.labels(MODEL)._value.get()
    assert continued == 4, "round robin sent every third stream to the broken replica"
    registry = gateway.app.state.registry
    wait_for(lambda: registry.total_inflight() == 0, what="in-flight back to zero")


def test_a_replica_killed_mid_stream_loses_no_stream(mock_engines, gateways) -> None:
    """The issue's row: 100 streams, their replica killed mid-way: all complete, every token, one usage."""
    engines = [mock_engines(model=MODEL, token_delay_ms=30) for _ in range(3)]
    gateway = _gateway(gateways, engines)
    expected = asyncio.run(_unbroken(engines[1].url, 100))
    doomed = engines[0]

    def kill_when_busy() -> None:  # once most of its third of the streams are running on it ...
        wait_for(lambda: doomed.app.counters.active >= 25, timeout_s=20, interval_s=0.005, what="streams")
        time.sleep(0.2)  # ... and have streamed some of their 24 tokens (30 ms each): mid-way
        doomed.kill()

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    results = asyncio.run(_through(gateway.url, 100))
    killer.join()
    for (text, chunks, usage), want in zip(results, expected, strict=True):
        _check_one_stream(text, chunks, usage, want)
    # the killed replica held ≥ 25 streams: those that had sent a byte were continued (how many had is a
    # matter of timing), the rest retried before their first byte; every one of the 100 completed above
    assert gateway.app.state.metrics.stream_continuations_total.labels(MODEL)._value.get() >= 1


def test_a_preemption_notice_moves_running_streams_before_the_replica_goes(
    monkeypatch, mock_engines, gateways
) -> None:
    """The issue's row, scaled to the test's clock: 50 long streams, a notice whose cut comes while they
    run (deadline 0.6 s, margin 0.2 s, streams of 1.5 s): all complete."""
    monkeypatch.setenv("LLM_GATEWAY_ADMIN_KEY", ADMIN_KEY)
    engines = [mock_engines(model=MODEL, token_delay_ms=60) for _ in range(3)]
    gateway = _gateway(gateways, engines)
    doomed = engines[0].url.removeprefix("http://")
    expected = asyncio.run(_unbroken(engines[1].url, 50))
    outcome: list[float] = []

    def notice() -> None:  # once its share of the streams runs on the doomed replica
        wait_for(lambda: engines[0].app.counters.active >= 12, timeout_s=20, interval_s=0.005, what="streams")
        response = httpx.post(
            f"{gateway.url}/admin/replicas/{doomed}/preempt",
            json={"deadline_s": 0.6, "margin_s": 0.2},
            headers={"authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert response.status_code == 200
        outcome.append(response.json()["cut_in_s"])

    timer = threading.Thread(target=notice)
    timer.start()
    results = asyncio.run(_through(gateway.url, 50))
    timer.join()
    assert outcome == [pytest.approx(0.4)]
    for (text, chunks, usage), want in zip(results, expected, strict=True):
        _check_one_stream(text, chunks, usage, want)
    assert gateway.app.state.metrics.stream_continuations_total.labels(MODEL)._value.get() >= 1, "cut, moved"
    replica = next(r for r in gateway.app.state.registry.all_replicas() if r.replica_id == doomed)
    assert replica.is_draining and replica.breaker.state == "closed", "drained, not blamed"
    started_before = engines[0].app.counters.started
    asyncio.run(_through(gateway.url, 3))
    assert engines[0].app.counters.started == started_before, "nothing new goes to a preempted replica"
    bad = httpx.post(
        f"{gateway.url}/admin/replicas/{doomed}/preempt",
        json={"deadline_s": -1},
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert bad.status_code == 400 and bad.headers["x-gateway-reject-reason"] == "bad_request"
