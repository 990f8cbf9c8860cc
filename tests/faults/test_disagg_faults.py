"""Fault-matrix rows for a disaggregated pool: real mock engines in prefill and decode roles (vLLM's
kv_transfer_params legs and SGLang's bootstrap legs, `tests.disagg_fleet`) behind a real gateway. The
serve path is the aggregated pools' (`gateway.proxy.serving`), with the pool's legs: the same
continuation, containment, preemption cut-over and autoscaling signals.

- a decode replica killed mid-stream: every stream completes with its whole text (a new prefill of the
  text so far, then a decode on another decode replica), one id, one role chunk, one usage total;
- poison requests (a prompt the prefill or the decode engines fail on) mixed into good traffic: good
  traffic served, poison quarantined (422) and refused at arrival after, no breaker opens on either set;
- a preemption notice on a decode replica: its running streams are cut over before it goes (it is killed
  at the notice's deadline) and complete whole; it is drained and not blamed;
- the autoscaling signal is exported for both sets, each fed by its own legs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from mock_engine.disagg_params import Protocol, Role
from mock_engine.faults import FaultSettings
from tests.disagg_fleet import disagg_engine, disagg_pool
from tests.faults.conftest import MATRIX
from tests.faults.traffic import MODEL
from tests.servers import ServerThread, gateway_settings, start_mock_engine
from tests.waiting import wait_for

PROTOCOLS = [Protocol.VLLM, Protocol.SGLANG]
TOKENS = 24
STREAMS = 15
RETRIES = {"max_attempts": 3, "budget_ratio": 1.0, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
TIMEOUTS = {"ttft_s": 2, "idle_s": 2.0}
ADMIN_KEY = "preempt-admin"
MARKER = "POISON-PILL"

Engines = Callable[..., ServerThread]
Gateways = Callable[[dict[str, Any]], ServerThread]


@pytest.fixture
def engines() -> Iterator[Engines]:
    """Starts mock engines in a disaggregated role (`disagg_engine`'s arguments); stops those still up."""
    started: list[ServerThread] = []

    def factory(role: Role, protocol: Protocol, faults: FaultSettings | None = None, **timing: float):
        server = disagg_engine(MODEL, role, protocol, faults, **timing)
        started.append(server)
        return server

    yield factory
    for server in started:
        if not server.server.should_exit:
            server.stop()


def _urls(servers: list[ServerThread]) -> list[str]:
    return [s.url for s in servers]


def _prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"tell me story number {i}"}]


async def _stream(client: openai.AsyncOpenAI, i: int) -> tuple[str, list[Any], Any]:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=_prompt(i),
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        seed=i,
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = next(c.usage for c in chunks if c.usage is not None)
    return text, chunks, usage


async def _streams(url: str, count: int) -> list[tuple[str, list[Any], Any]]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20) as client:
        return list(await asyncio.gather(*(_stream(client, i) for i in range(count))))


def _expected(count: int) -> list[str]:
    """What an aggregated engine streams for the same prompts and seeds (a decode's text is that)."""
    engine = start_mock_engine(model=MODEL)
    try:
        return [text for text, _, _ in asyncio.run(_streams(engine.url, count))]
    finally:
        engine.stop()


def _whole(results: list[tuple[str, list[Any], Any]], expected: list[str]) -> Counter[str]:
    """Each stream is the unbroken one: its text, one id, one role chunk, every token once, one usage
    total; the tally for the matrix."""
    for (text, chunks, usage), want in zip(results, expected, strict=True):
        assert text == want, "the continued stream says what an unbroken run says"
        assert len({c.id for c in chunks}) == 1, "one id for the whole stream"
        assert len([c for c in chunks if c.choices and c.choices[0].delta.role]) == 1, "one role chunk"
        assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == TOKENS
        assert [c for c in chunks if c.usage is not None] == [chunks[-1]], "one usage total, last"
        assert usage.completion_tokens == TOKENS
    return Counter({"ok": len(results)})


def _settled(gateway: ServerThread, servers: list[ServerThread]) -> None:
    registry = gateway.app.state.registry
    wait_for(lambda: registry.total_inflight() == 0, what="gateway in-flight back to zero")
    assert all(r.inflight_requests == 0 for r in registry.all_replicas())
    live = [s for s in servers if not s.server.should_exit]
    wait_for(lambda: all(s.app.counters.active == 0 for s in live), what="engines idle")


def _continuations(gateway: ServerThread) -> float:
    return float(gateway.app.state.metrics.stream_continuations_total.labels(MODEL)._value.get())


def _streaming_fleet(protocol: Protocol, engines: Engines, gateways: Gateways) -> tuple[ServerThread, list]:
    """Two prefill replicas and three decode replicas streaming a token every 40 ms, taken in turn."""
    prefill = [engines(Role.PREFILL, protocol) for _ in range(2)]
    decode = [engines(Role.DECODE, protocol, token_s=0.04) for _ in range(3)]
    pool = disagg_pool(
        MODEL,
        protocol,
        _urls(prefill),
        _urls(decode),
        decode_policy="round-robin",
        retries=RETRIES,
        timeouts=TIMEOUTS,
    )
    return gateways(gateway_settings([pool])), [*prefill, *decode]


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=str)
def test_a_decode_replica_killed_mid_stream_loses_no_stream(
    protocol: Protocol, engines: Engines, gateways: Gateways
) -> None:
    gateway, servers = _streaming_fleet(protocol, engines, gateways)
    doomed = servers[2]  # the first decode replica: a third of the streams
    expected = _expected(STREAMS)

    def kill_mid_way() -> None:  # once its streams run and have sent some of their 24 tokens
        wait_for(lambda: doomed.app.counters.active >= 4, timeout_s=20, interval_s=0.005, what="streams")
        time.sleep(0.3)
        doomed.kill()

    killer = threading.Thread(target=kill_mid_way)
    killer.start()
    results = asyncio.run(_streams(gateway.url, STREAMS))
    killer.join()
    MATRIX[f"disaggregated ({protocol}): decode replica killed mid-stream"] = _whole(results, expected)
    assert _continuations(gateway) >= 1, "the broken streams were continued: a new prefill, another decode"
    _settled(gateway, servers)


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=str)
def test_a_preemption_notice_on_a_decode_replica_cuts_its_streams_over(
    protocol: Protocol, monkeypatch: pytest.MonkeyPatch, engines: Engines, gateways: Gateways
) -> None:
    monkeypatch.setenv("LLM_GATEWAY_ADMIN_KEY", ADMIN_KEY)
    gateway, servers = _streaming_fleet(protocol, engines, gateways)
    doomed = servers[2]
    doomed_id = doomed.url.removeprefix("http://")
    expected = _expected(STREAMS)
    answers: list[float] = []

    def notice() -> None:  # the cut (0.6 − 0.2 s after the notice) comes while its streams run
        wait_for(lambda: doomed.app.counters.active >= 4, timeout_s=20, interval_s=0.005, what="streams")
        response = httpx.post(
            f"{gateway.url}/admin/replicas/{doomed_id}/preempt",
            json={"deadline_s": 0.6, "margin_s": 0.2},
            headers={"authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert response.status_code == 200
        answers.append(response.json()["cut_in_s"])
        time.sleep(0.6)  # the deadline: the replica goes, with whatever still runs on it
        doomed.kill()

    timer = threading.Thread(target=notice)
    timer.start()
    results = asyncio.run(_streams(gateway.url, STREAMS))
    timer.join()
    assert answers == [pytest.approx(0.4)]
    MATRIX[f"disaggregated ({protocol}): preemption notice on a decode replica"] = _whole(results, expected)
    assert _continuations(gateway) >= 1, "its running streams were cut and continued elsewhere"
    replica = next(r for r in gateway.app.state.registry.all_replicas() if r.replica_id == doomed_id)
    assert replica.is_draining and replica.breaker.state == "closed", "drained, not blamed"
    failures = gateway.app.state.metrics.upstream_failures_total
    charged = [s for s in failures.collect()[0].samples if s.name.endswith("_total") and s.value]
    assert charged == [], "a cut is nobody's failure, and nothing ran on it when it went"
    _settled(gateway, servers)


async def _send(client: httpx.AsyncClient, text: str, stream: bool) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "stream": stream,
    }
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        return response.headers.get("x-gateway-reject-reason", "NO_REASON")
    if stream and not response.text.rstrip().endswith("data: [DONE]"):
        return "TRUNCATED"
    return "ok"


async def _mixed(url: str, good: int, poison: list[str]) -> tuple[list[str], list[str]]:
    """Good and poison requests interleaved, a few at a time (every other one streamed)."""
    async with httpx.AsyncClient(base_url=url, timeout=15) as client:
        good_tasks, poison_tasks = [], []
        for i in range(max(good, len(poison))):
            if i < good:
                good_tasks.append(asyncio.create_task(_send(client, f"good request {i}", i % 2 == 0)))
            if i < len(poison):
                poison_tasks.append(asyncio.create_task(_send(client, poison[i], i % 2 == 1)))
            await asyncio.sleep(0.02)
        return list(await asyncio.gather(*good_tasks)), list(await asyncio.gather(*poison_tasks))


@pytest.mark.parametrize("poisoned", [Role.PREFILL, Role.DECODE], ids=str)
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=str)
def test_poison_requests_on_a_disaggregated_pool_are_quarantined_and_open_no_breaker(
    protocol: Protocol, poisoned: Role, engines: Engines, gateways: Gateways
) -> None:
    """The engines of one set answer 500 to a poison prompt: two replicas of that set fail it while
    both serve others, so it is quarantined (its set's failures are the request's, not the replicas')."""
    poison = FaultSettings(poison_marker=MARKER, poison_effect="error")
    prefill = [
        engines(Role.PREFILL, protocol, poison if poisoned is Role.PREFILL else None) for _ in range(2)
    ]
    decode = [engines(Role.DECODE, protocol, poison if poisoned is Role.DECODE else None) for _ in range(2)]
    pool = disagg_pool(
        MODEL,
        protocol,
        _urls(prefill),
        _urls(decode),
        prefill_policy="round-robin",
        decode_policy="round-robin",
        retries={"budget_ratio": 0.5, "backoff_initial_s": 0.001, "backoff_max_s": 0.01},
        breaker={"consecutive_failures": 3, "open_s": 5.0},
    )
    gateway = gateways(gateway_settings([pool]))
    warm, _ = asyncio.run(_mixed(gateway.url, 6, []))
    assert Counter(warm) == {"ok": 6}
    prompts = [f"{MARKER} number {i}" for i in range(10)]
    good_each, bad_each = asyncio.run(_mixed(gateway.url, 30, prompts))
    good, bad = Counter(good_each), Counter(bad_each)
    name = f"disaggregated ({protocol}): poison ({poisoned} engines fail it)"
    MATRIX[f"{name}, good traffic"] = good
    MATRIX[f"{name}, poison requests"] = bad
    assert good == {"ok": 30}, "good traffic is served, every request"
    assert set(bad) <= {"request_quarantined", "upstream_status"}, bad
    assert bad["request_quarantined"] >= len(prompts) // 2, bad
    replicas = list(gateway.app.state.registry.all_replicas())
    assert all(r.breaker.state == "closed" for r in replicas), [
        (r.replica_id, r.breaker.state) for r in replicas
    ]
    servers = [*prefill, *decode]
    hit = sum(s.app.counters.poisoned_injected for s in servers)
    quarantined = [
        p for p, outcome in zip(prompts, bad_each, strict=True) if outcome == "request_quarantined"
    ]
    _, again = asyncio.run(_mixed(gateway.url, 0, quarantined))
    assert Counter(again) == {"request_quarantined": len(quarantined)}, "refused at arrival"
    assert sum(s.app.counters.poisoned_injected for s in servers) == hit, "no replica was touched"
    _settled(gateway, servers)


def test_the_autoscaling_signal_is_exported_for_both_sets(engines: Engines, gateways: Gateways) -> None:
    """Each set has its autoscaler: both see the pool's arrivals; the decode set the served requests'
    output, the prefill set one token per prefill leg."""
    protocol = Protocol.VLLM
    prefill, decode = engines(Role.PREFILL, protocol), engines(Role.DECODE, protocol)
    autoscale = {"decode_tokens_per_s": 400, "evaluation_period_s": 0.2, "window_s": 5}
    pool = disagg_pool(MODEL, protocol, [prefill.url], [decode.url], decode_cap=4, autoscale=autoscale)
    gateway = gateways(gateway_settings([pool]))
    asyncio.run(_streams(gateway.url, 8))
    signals = gateway.app.state.signals
    sets = (MODEL, f"{MODEL}/prefill")

    def gauge(name: str, pool: str) -> float | None:
        return gateway.app.state.metrics.registry.get_sample_value(f"llm_gateway_{name}", {"pool": pool})

    async def sample() -> None:
        signals.sample_and_export()

    def exported() -> bool:
        gateway.call(sample())
        return all(gauge("desired_replicas", pool) is not None for pool in sets)

    wait_for(exported, timeout_s=5, interval_s=0.05, what="a decision for each set")
    for pool in sets:
        assert (gauge("autoscale_arrival_rate_per_second", pool) or 0) > 0, pool
    assert gauge("autoscale_mean_output_tokens", MODEL) == TOKENS
    assert gauge("autoscale_mean_output_tokens", f"{MODEL}/prefill") == 1, "one token per prefill leg"
    _settled(gateway, [prefill, decode])
