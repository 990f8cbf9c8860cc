"""Clustered failures (issue 28): containment that holds when failures come together in one gateway's
life, at the default retry budget, with one attempt, and with no budget at all.

Real servers on 127.0.0.1: a uvicorn gateway in front of three mock engines whose faults change
between phases (`set_faults_threadsafe`). Poison prompts carry `MARKER`; each engine's fault decision is
wrapped to count how often each poison prompt reached an engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import openai

from mock_engine.faults import FaultSettings
from tests.faults.conftest import MATRIX
from tests.faults.test_containment import MARKER, _each, _settled
from tests.faults.traffic import MODEL
from tests.integration.test_continuation import _check_one_stream, _prompt
from tests.servers import ServerThread, gateway_settings
from tests.waiting import wait_for

Engines = Callable[..., ServerThread]
Gateways = Callable[[dict[str, Any]], ServerThread]
TIMEOUTS = {"connect_s": 1.0, "ttft_s": 2.0, "idle_s": 1.5, "nonstream_s": 4.0}
"""Loose enough that a loaded machine does not stall a good stream (its one resume would be spent)."""
BREAKER = {"consecutive_failures": 3, "open_s": 5.0}
HEALTH = {"interval_s": 0.3, "timeout_s": 2.0, "unhealthy_threshold": 1, "healthy_threshold": 1}
STREAM_TOKENS = 60
EMPTY_BUDGET = {"budget_ratio": 0.0, "budget_min_per_s": 0.0}


def _gateway(gateways: Gateways, engines: list[ServerThread], **pool: Any) -> ServerThread:
    """The default policy (prefix-index: identical prompts go back to the replica that has them) and
    the default retry budget unless `pool` says otherwise; short timers, a breaker after 3 failures."""
    settings = {
        "model": MODEL,
        "replicas": {"static": [e.url for e in engines]},
        "timeouts": TIMEOUTS,
        "breaker": BREAKER,
        "health": HEALTH,
        "scrape": {"enabled": False},
        **pool,
    }
    return gateways(gateway_settings([settings]))


def _fleet(mock_engines: Engines, effect: str = "error") -> list[ServerThread]:
    poison = FaultSettings(poison_marker=MARKER, poison_effect=effect)  # type: ignore[arg-type]
    return [mock_engines(model=MODEL, token_delay_ms=5, faults=poison) for _ in range(3)]


def _count_reaches(engines: list[ServerThread]) -> Counter[str]:
    """Each poison prompt's count of generations that reached an engine (from now on)."""
    reached: Counter[str] = Counter()
    lock = threading.Lock()
    for engine in engines:
        control = engine.app.faults
        original = control.plan

        def plan(prompt: str | None = None, original: Any = original) -> Any:
            decided = original(prompt)
            if decided.poisoned:
                with lock:
                    reached[prompt or ""] += 1
            return decided

        control.plan = plan
    return reached


def _metric(gateway: ServerThread, name: str, **labels: str) -> float:
    value = gateway.app.state.metrics.registry.get_sample_value(f"llm_gateway_{name}", labels)
    return 0.0 if value is None else float(value)


def _opened(gateway: ServerThread) -> float:
    samples = gateway.app.state.metrics.breaker_transitions_total.collect()[0].samples
    return sum(s.value for s in samples if s.name.endswith("_total") and s.labels.get("state") == "open")


def _replica_charges(gateway: ServerThread, kind: str) -> float:
    return _metric(gateway, "upstream_failures_total", model=MODEL, cause="replica", kind=kind)


def _poison_burst(url: str, prompts: int, copies: int, good: int) -> tuple[Counter[str], Counter[str]]:
    """`copies` copies of each of `prompts` poison prompts, interleaved, with `good` requests beside."""
    poison = [f"{MARKER} prompt {i % prompts}" for i in range(prompts * copies)]
    good_each, bad_each = asyncio.run(_each(url, good, poison))
    return Counter(good_each), Counter(bad_each)


def _check_poison_contained(
    name: str,
    gateway: ServerThread,
    reached: Counter[str],
    good: Counter[str],
    bad: Counter[str],
    *,
    most: int,
) -> None:
    MATRIX[f"{name}, good traffic"] = good
    MATRIX[f"{name}, poison requests"] = bad
    assert set(good) == {"ok"}, good
    assert set(bad) <= {"request_quarantined", "upstream_status"}, bad
    assert len(reached) == 3 and max(reached.values()) <= most, reached
    assert bad["request_quarantined"] >= sum(bad.values()) - sum(reached.values()), (
        "the rest refused at arrival"
    )
    assert _replica_charges(gateway, "status_5xx") == 0, "no replica charged for a poison prompt's 500"


async def _slow_streams(url: str, count: int, started: list[int]) -> list[tuple[str, list[Any], Any]]:
    """`count` seeded streams of `STREAM_TOKENS` tokens; `started[0]` counts those with content."""

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, list[Any], Any]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=_prompt(i),  # type: ignore[arg-type]
            max_tokens=STREAM_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            seed=i,
        )
        chunks = []
        seen_content = False
        async for chunk in stream:
            if not seen_content and chunk.choices and chunk.choices[0].delta.content:
                seen_content = True
                started[0] += 1
            chunks.append(chunk)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks, next(c.usage for c in chunks if c.usage is not None)

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(count))))


def _kill_a_busy_replica(
    gateway: ServerThread, engines: list[ServerThread], streams: int, at_least: int
) -> tuple[list[tuple[str, list[Any], Any]], ServerThread]:
    """`streams` slow streams through the gateway; once every one has content and one replica holds
    `at_least` of them, that replica is killed (SIGKILL-like: connections reset mid-response)."""
    started = [0]
    killed: list[ServerThread] = []

    def kill_when_busy() -> None:
        wait_for(
            lambda: started[0] == streams and max(e.app.counters.active for e in engines) >= at_least,
            timeout_s=10,
            interval_s=0.005,
            what="streams running, a dozen on one replica",
        )
        busiest = max(engines, key=lambda e: e.app.counters.active)
        killed.append(busiest)
        busiest.kill()

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    results = asyncio.run(_slow_streams(gateway.url, streams, started))
    killer.join()
    return results, killed[0]


def _unbroken(engine: ServerThread, count: int) -> list[str]:
    started = [0]
    return [text for text, _, _ in asyncio.run(_slow_streams(engine.url, count, started))]


def _check_every_stream_whole(results: list[tuple[str, list[Any], Any]], expected: list[str]) -> None:
    for (text, chunks, usage), want in zip(results, expected, strict=True):
        _check_one_stream(text, chunks, usage, want, tokens=STREAM_TOKENS)


def test_clustered_failures_in_one_gateways_life(mock_engines: Engines, gateways: Gateways) -> None:
    """A poison mix, a stall burst, 30 copies of three poison prompts (500 everywhere) at the default
    retry budget, then a replica holding a dozen slow streams killed — one gateway, within one budget
    window. Good requests all succeed; each poison prompt reaches engines at most 3 times; no breaker
    opens on poison; every stream on the killed replica completes with its whole text."""
    engines = _fleet(mock_engines, effect="crash")
    gateway = _gateway(gateways, engines)
    warm, _ = asyncio.run(_each(gateway.url, 6, []))
    assert Counter(warm) == {"ok": 6}
    expected = _unbroken(engines[0], 36)

    opened = _opened(gateway)
    good, bad = (
        Counter(o) for o in asyncio.run(_each(gateway.url, 60, [f"{MARKER} mix {i}" for i in range(20)]))
    )
    MATRIX["clustered: poison mix (crash), good traffic"] = good
    assert good == {"ok": 60}, good
    assert set(bad) <= {"request_quarantined", "upstream_protocol"}, bad
    assert _opened(gateway) == opened, "no breaker opened on the poison mix"

    stalling = engines[1]
    stalling.app.set_faults_threadsafe({"stall_after_tokens": 3})
    burst, _ = asyncio.run(_each(gateway.url, 24, [], all_streamed=True))
    stalling.app.set_faults_threadsafe({"stall_after_tokens": None})
    MATRIX["clustered: stall burst (streams)"] = Counter(burst)
    assert Counter(burst) == {"ok": 24}, "every stalled stream continued elsewhere"
    assert stalling.app.counters.stalled_injected >= 3, "the burst stalled streams"

    for engine in engines:
        engine.app.set_faults_threadsafe({"poison_effect": "error"})
    reached = _count_reaches(engines)
    opened = _opened(gateway)
    good, bad = _poison_burst(gateway.url, prompts=3, copies=10, good=10)
    _check_poison_contained(
        "clustered: 30 copies of 3 poison prompts (500)", gateway, reached, good, bad, most=3
    )
    assert _opened(gateway) == opened, "no breaker opened on poison"

    for engine in engines:
        engine.app.set_faults_threadsafe({"jitter_ms": 30})
    listed = _metric(gateway, "quarantine_total", model=MODEL, outcome="listed")
    results, killed = _kill_a_busy_replica(gateway, engines, streams=36, at_least=12)
    _check_every_stream_whole(results, expected)
    MATRIX["clustered: replica holding a dozen slow streams killed"] = Counter({"ok": len(results)})
    assert _metric(gateway, "stream_continuations_total", model=MODEL) >= 12
    assert _metric(gateway, "quarantine_total", model=MODEL, outcome="listed") == listed, "no good prompt"
    _settled(gateway, [e for e in engines if e is not killed])


def test_poison_with_one_attempt_is_quarantined_and_charges_no_replica(
    mock_engines: Engines, gateways: Gateways
) -> None:
    """`max_attempts: 1`: no request gets a second try, yet identical poison requests are quarantined
    after two replicas and no replica is charged."""
    engines = _fleet(mock_engines)
    gateway = _gateway(gateways, engines, retries={"max_attempts": 1})
    warm, _ = asyncio.run(_each(gateway.url, 6, []))
    assert Counter(warm) == {"ok": 6}
    reached = _count_reaches(engines)
    good, bad = _poison_burst(gateway.url, prompts=3, copies=10, good=20)
    _check_poison_contained(
        "max_attempts 1: 30 copies of 3 poison prompts", gateway, reached, good, bad, most=2
    )
    assert _opened(gateway) == 0
    _settled(gateway, engines)


def test_an_empty_retry_budget_still_quarantines_poison_and_continues_streams(
    mock_engines: Engines, gateways: Gateways
) -> None:
    """`budget_ratio: 0, budget_min_per_s: 0`: not one retry, yet poison is quarantined across requests
    and every stream on a killed replica is continued (a continuation is no retry)."""
    engines = _fleet(mock_engines)
    gateway = _gateway(gateways, engines, retries=EMPTY_BUDGET)
    warm, _ = asyncio.run(_each(gateway.url, 6, []))
    assert Counter(warm) == {"ok": 6}
    expected = _unbroken(engines[0], 30)
    reached = _count_reaches(engines)
    good, bad = _poison_burst(gateway.url, prompts=3, copies=10, good=20)
    _check_poison_contained(
        "empty retry budget: 30 copies of 3 poison prompts", gateway, reached, good, bad, most=2
    )
    assert _opened(gateway) == 0
    for engine in engines:
        engine.app.set_faults_threadsafe({"jitter_ms": 30})
    results, killed = _kill_a_busy_replica(gateway, engines, streams=30, at_least=8)
    _check_every_stream_whole(results, expected)
    MATRIX["empty retry budget: replica holding slow streams killed"] = Counter({"ok": len(results)})
    assert _metric(gateway, "retries_total", reason="stream_broken") == 0, "continuations are no retries"
    _settled(gateway, [e for e in engines if e is not killed])


def test_a_replica_that_answers_500_to_everything_is_still_ejected_with_one_attempt(
    mock_engines: Engines, gateways: Gateways
) -> None:
    """The guard against the hold: with `max_attempts: 1` a broken replica's failures are held, then
    charged to it (it serves nobody since and nothing fails elsewhere): its breaker opens; distinct good
    prompts are never quarantined."""
    engines = [mock_engines(model=MODEL, token_delay_ms=5) for _ in range(3)]
    gateway = _gateway(
        gateways, engines, policy="round-robin", retries={"max_attempts": 1}, attribution={"hold_s": 0.3}
    )
    warm, _ = asyncio.run(_each(gateway.url, 6, []))
    assert Counter(warm) == {"ok": 6}
    broken = engines[0]
    broken.app.set_faults_threadsafe({"error_rate": 1.0, "error_status": 500})
    bad = gateway.app.state.registry.pools[MODEL].replicas[broken.url.removeprefix("http://")]
    deadline = time.monotonic() + 10
    outcomes: Counter[str] = Counter()
    while bad.breaker.state == "closed" and time.monotonic() < deadline:
        each, _ = asyncio.run(_each(gateway.url, 6, []))
        outcomes.update(each)
        time.sleep(0.1)
    MATRIX["max_attempts 1: one replica answering 500 to everything"] = outcomes
    assert bad.breaker.state != "closed", "the broken replica was ejected"
    assert set(outcomes) <= {"ok", "upstream_status"}, outcomes
    assert _metric(gateway, "quarantine_total", model=MODEL, outcome="quarantined") == 0
    assert _metric(gateway, "quarantine_total", model=MODEL, outcome="listed") == 0
    _settled(gateway, engines)
