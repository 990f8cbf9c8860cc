"""Silent streams (idle timeouts): a stream that goes silent on two replicas is a poison request only
when neither replica shows load (gateway.proxy.failure_attribution). Real mock engines and a real
gateway on 127.0.0.1; the idle timeout (0.3 s) is shorter than the first-token deadline (2 s), so an
engine that sends its role chunk and then nothing is an idle timeout, retried on the other replica."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from mock_engine.faults import FaultSettings
from tests.faults.conftest import MATRIX
from tests.faults.test_containment import MARKER, _each, _gateway, _send, _settled
from tests.faults.traffic import MODEL
from tests.servers import ServerThread

TIMEOUTS = {"connect_s": 0.5, "ttft_s": 2.0, "idle_s": 0.3, "nonstream_s": 2.0}
POOL = {
    "timeouts": TIMEOUTS,
    "retries": {"max_attempts": 2, "budget_ratio": 1.0},
    "breaker": {"consecutive_failures": 1000, "open_s": 5.0},
}


def _failures(gateway: ServerThread, cause: str, kind: str) -> float:
    samples = gateway.app.state.metrics.upstream_failures_total.collect()[0].samples
    return float(
        sum(
            s.value
            for s in samples
            if s.name.endswith("_total") and s.labels.get("cause") == cause and s.labels.get("kind") == kind
        )
    )


def test_streams_silenced_on_both_replicas_by_replicas_that_silence_everyone_are_not_quarantined(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> None:
    """Both replicas go silent on half of all streams (as a saturated engine would, with engine metrics
    off): requests silenced on both are answered 504, never 422, and their prompts stay servable."""
    engines = [mock_engines(model=MODEL, token_delay_ms=5) for _ in range(2)]
    gateway = _gateway(gateways, [e.url for e in engines], **POOL)
    warm, _ = asyncio.run(_each(gateway.url, 4, []))
    assert Counter(warm) == {"ok": 4}
    for engine in engines:
        engine.app.set_faults_threadsafe({"stall_after_tokens": 0, "stall_rate": 0.5})
    outcomes, _ = asyncio.run(_each(gateway.url, 40, [], all_streamed=True))
    counts = Counter(outcomes)
    MATRIX["half of all streams silent on both replicas"] = counts
    assert set(counts) <= {"ok", "upstream_idle_timeout"}, counts
    assert counts["upstream_idle_timeout"] >= 1, "some requests were silenced on both replicas"
    assert gateway.app.state.metrics.quarantine_total.labels(MODEL, "quarantined")._value.get() == 0
    assert _failures(gateway, "request", "stream_idle") == 0, "not the requests'"
    for engine in engines:
        engine.app.set_faults_threadsafe({"stall_rate": 0.0})
    again, _ = asyncio.run(_each(gateway.url, 4, [], all_streamed=True))
    assert Counter(again) == {"ok": 4}
    _settled(gateway, engines)


def test_a_prompt_that_silences_quiet_replicas_is_still_quarantined(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> None:
    """A real poison silence: good traffic is served on both replicas, only the poison prompts go
    silent (after the role chunk). Each, sent one after another, is quarantined after two replicas."""
    poison = FaultSettings(poison_marker=MARKER, poison_effect="stall")
    engines = [mock_engines(model=MODEL, token_delay_ms=5, faults=poison) for _ in range(2)]
    gateway = _gateway(gateways, [e.url for e in engines], **POOL)

    async def run() -> tuple[list[str], list[str]]:
        good = asyncio.create_task(_each(gateway.url, 20, [], all_streamed=True))
        await asyncio.sleep(0.3)  # both replicas have served others
        bad = []
        async with httpx.AsyncClient(base_url=gateway.url, timeout=15) as client:
            for i in range(4):
                bad.append(await _send(client, f"{MARKER} silent {i}", True))
        return (await good)[0], bad

    good, bad = asyncio.run(run())
    MATRIX["poison (idle silence), good traffic"] = Counter(good)
    MATRIX["poison (idle silence), poison requests"] = Counter(bad)
    assert Counter(good) == {"ok": 20}
    assert Counter(bad) == {"request_quarantined": 4}
    assert _failures(gateway, "request", "stream_idle") == 8
    _settled(gateway, engines)
