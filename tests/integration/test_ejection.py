"""The ejection budget over real HTTP (issue 14): a uvicorn gateway in front of three mock engines, some
answering 500 to everything. Requests are sent one at a time, so every count is exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from gateway.upstream.breaker import BreakerState
from mock_engine.faults import FaultSettings
from tests.servers import ServerThread, gateway_settings

MODEL = "test-model"
CHAT = "/v1/chat/completions"
TRIP_AFTER = 3  # breaker.consecutive_failures


def _fleet(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread], bad: int
) -> tuple[ServerThread, list[ServerThread]]:
    faults = FaultSettings(error_rate=1.0, error_status=500)
    engines = [mock_engines(model=MODEL, faults=faults if i < bad else None) for i in range(3)]
    pool = {
        "model": MODEL,
        "replicas": {"static": [e.url for e in engines]},
        "policy": "round-robin",  # every replica gets its turn: the bad ones are tried, not avoided by luck
        # the retry budget is not under test here: room for two retries per request
        "retries": {"max_attempts": 3, "budget_ratio": 1.0, "budget_min_per_s": 10, "backoff_max_s": 0.01},
        # open long enough that no breaker half-opens during the test; the budget default: 0.5
        "breaker": {"consecutive_failures": TRIP_AFTER, "open_s": 60, "max_open_s": 60},
        "health": {"enabled": False},
        "scrape": {"enabled": False},
    }
    return gateways(gateway_settings([pool])), engines


def _send(gateway: ServerThread, requests: int) -> list[int]:
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        return [client.post(CHAT, json=body).status_code for _ in range(requests)]


def _counter(gateway: ServerThread, name: str) -> float:
    family = getattr(gateway.app.state.metrics, name)
    return float(family.labels(MODEL)._value.get())


def test_two_bad_replicas_of_three_eject_one_and_traffic_keeps_flowing(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> None:
    gateway, engines = _fleet(mock_engines, gateways, bad=2)
    pool = gateway.app.state.registry.pools[MODEL]
    statuses = _send(gateway, 30)
    assert statuses == [200] * 30, "every request failed over to the good replica"
    bad = [pool.replicas[e.url.removeprefix("http://")] for e in engines[:2]]
    states = sorted(r.breaker.state for r in bad)
    assert states == [BreakerState.CLOSED, BreakerState.OPEN], "budget floor(0.5 × 3) = 1: one ejected"
    assert pool.ejected_count() == 1 == pool.ejection_budget()
    refused = _counter(gateway, "ejections_refused_total")
    assert refused > 0, "the second trip was refused, and counted"
    hits = sorted(e.app.counters.failed_injected for e in engines[:2])
    assert hits[0] == TRIP_AFTER, "the ejected one got nothing after its breaker opened"
    assert refused == hits[1] - TRIP_AFTER + 1, "every failure past the threshold of the kept one: refused"
    assert _counter(gateway, "pool_panic") == 0, "2 of 3 routable: no panic"
    assert engines[2].app.counters.finished == 30, "the good replica served every request"


def test_one_bad_replica_is_ejected_within_the_thresholds_and_the_others_serve(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> None:
    """The fault matrix's third case: one replica answering 500 to everything."""
    gateway, engines = _fleet(mock_engines, gateways, bad=1)
    pool = gateway.app.state.registry.pools[MODEL]
    statuses = _send(gateway, 30)
    assert statuses == [200] * 30
    bad = pool.replicas[engines[0].url.removeprefix("http://")]
    assert bad.breaker.state is BreakerState.OPEN
    assert engines[0].app.counters.failed_injected == TRIP_AFTER, (
        "ejected after exactly its consecutive failures"
    )
    assert _counter(gateway, "ejections_refused_total") == 0
    assert engines[1].app.counters.finished + engines[2].app.counters.finished == 30
    assert min(engines[1].app.counters.finished, engines[2].app.counters.finished) >= 10, "spread over both"
