"""The fault matrix (issue 6): for each fault, concurrent mixed traffic through a real gateway in front
of real mock engines, and the same promises every time — no request outlives its deadlines, every one
ends in success or a documented error, retries stay within budget, in-flight counts return to zero."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mock_engine.faults import FaultSettings
from tests.faults.conftest import MATRIX
from tests.faults.traffic import MODEL, VIOLATIONS, Outcome, run_traffic, tally
from tests.servers import ServerThread, free_port, gateway_settings, wait_until

REQUESTS = 40
TIMEOUTS = {"connect_s": 0.5, "ttft_s": 0.6, "idle_s": 0.4, "nonstream_s": 2.0}
RETRIES = {"max_attempts": 3, "backoff_initial_s": 0.01, "backoff_max_s": 0.05}
BUDGET_FLOOR_RETRIES = 5  # budget_min_per_s 0.5 × 10 s window
# Worst case for one request: every attempt waits its full deadline, plus backoffs and slack.
DEADLINE_BOUND_S = RETRIES["max_attempts"] * TIMEOUTS["nonstream_s"] + 1.5


def _gateway(gateways: Callable[[dict[str, Any]], ServerThread], urls: list[str]) -> ServerThread:
    pool = {
        "model": MODEL,
        "replicas": {"static": urls},
        "policy": "least-load",
        "timeouts": TIMEOUTS,
        "retries": RETRIES,
        "breaker": {"consecutive_failures": 3, "open_s": 0.5, "max_open_s": 2},
        "health": {"interval_s": 0.3, "unhealthy_threshold": 1, "healthy_threshold": 1, "timeout_s": 0.3},
        "scrape": {"enabled": False},
    }
    return gateways(gateway_settings([pool]))


def _check(
    name: str, outcomes: list[Outcome], allowed: set[str], gateway: ServerThread, engines: list[ServerThread]
) -> None:
    counts = tally(outcomes)
    MATRIX[name] = counts
    assert not VIOLATIONS & set(counts), counts
    assert set(counts) <= allowed, counts
    slowest = max(o.duration_s for o in outcomes)
    assert slowest <= DEADLINE_BOUND_S, f"a request outlived its deadlines: {slowest:.2f} s"
    registry = gateway.app.state.registry
    assert wait_until(lambda: registry.total_inflight() == 0), "gateway in-flight did not return to zero"
    assert all(r.inflight_requests == 0 for r in registry.all_replicas())
    assert wait_until(lambda: all(e.app.counters.active == 0 for e in engines)), "an engine kept working"
    metrics = gateway.app.state.metrics
    by_reason = {
        s.labels["reason"]: s.value
        for s in metrics.retries_total.collect()[0].samples
        if s.name.endswith("_total")
    }
    stale = by_reason.pop("stale_connection", 0)
    by_reason.pop("connect", 0)  # free: the request never reached an engine (retry_policy docstring)
    budgeted = sum(by_reason.values())
    assert budgeted <= 0.1 * len(outcomes) + BUDGET_FLOOR_RETRIES + 1, f"{budgeted} retries exceed the budget"
    assert stale <= len(outcomes), "at most one free retry per request on a connection the engine closed"


def _fleet(mock_engines, faults: FaultSettings, faulty: int = 1, **kwargs: Any) -> list[ServerThread]:
    return [
        mock_engines(model=MODEL, token_delay_ms=5, faults=faults if i < faulty else None, **kwargs)
        for i in range(3)
    ]


FAULTS: dict[str, tuple[FaultSettings, set[str]]] = {
    "500 errors": (FaultSettings(error_rate=1.0, error_status=500), {"ok", "upstream_status"}),
    "503 + Retry-After": (
        FaultSettings(error_rate=1.0, error_status=503, retry_after_s=1),
        {"ok", "upstream_status"},
    ),
    "429 + Retry-After": (
        FaultSettings(error_rate=1.0, error_status=429, retry_after_s=1),
        {"ok", "upstream_status"},
    ),
    "slow first token": (
        FaultSettings(slow_first_token_ms=2500),
        {"ok", "upstream_ttft_timeout", "upstream_total_timeout"},
    ),
    # Streams broken mid-way are continued on another replica (gateway.proxy.continuation); each
    # continuation is a retry from the pool's budget, so in this burst the non-streamed requests that
    # hit the faulty replica after the budget is spent end with their own error before the first byte.
    "stall mid-stream": (
        FaultSettings(stall_after_tokens=3),
        {"ok", "sse:upstream_idle_timeout", "upstream_total_timeout", "upstream_ttft_timeout"},
    ),
    "reset mid-stream": (
        FaultSettings(crash_after_tokens=3),
        {"ok", "sse:upstream_protocol", "upstream_protocol"},
    ),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_one_faulty_replica_of_three(name: str, mock_engines, gateways) -> None:
    faults, allowed = FAULTS[name]
    engines = _fleet(mock_engines, faults)
    gateway = _gateway(gateways, [e.url for e in engines])
    outcomes = asyncio.run(run_traffic(gateway.url, REQUESTS))
    _check(name, outcomes, allowed, gateway, engines)
    assert tally(outcomes)["ok"] >= REQUESTS // 2, "failover and routing away keep most requests whole"


def test_refused_connections_fail_over_invisibly(mock_engines, gateways) -> None:
    engines = _fleet(mock_engines, FaultSettings(refuse_connections=True))
    gateway = _gateway(gateways, [e.url for e in engines])
    outcomes = asyncio.run(run_traffic(gateway.url, REQUESTS))
    _check("refused connection", outcomes, {"ok"}, gateway, engines)


def test_the_breaker_opens_on_500s_and_recovers(mock_engines, gateways) -> None:
    engines = _fleet(mock_engines, FaultSettings(error_rate=1.0, error_status=500))
    gateway = _gateway(gateways, [e.url for e in engines])
    bad = gateway.app.state.registry.pools[MODEL].replicas[engines[0].url.removeprefix("http://")]
    asyncio.run(run_traffic(gateway.url, 20))
    assert bad.breaker.state != "closed", "consecutive 500s opened the breaker"
    hits_while_open = engines[0].app.counters.started
    asyncio.run(run_traffic(gateway.url, 10))
    assert engines[0].app.counters.started <= hits_while_open + 2, "an open breaker sends (almost) nothing"
    engines[0].app.set_faults_threadsafe({"error_rate": 0.0})
    time.sleep(2.2)
    outcomes = asyncio.run(run_traffic(gateway.url, 20, spacing_s=0.02))
    assert tally(outcomes) == {"ok": 20}
    assert bad.breaker.state == "closed", "a successful half-open probe closed it"
    transitions = gateway.app.state.metrics.breaker_transitions_total
    assert transitions.labels(bad.replica_id, "open")._value.get() >= 1
    assert transitions.labels(bad.replica_id, "closed")._value.get() >= 1, "every transition counted"
    assert engines[0].app.counters.finished > 0, "traffic returned to the recovered replica"


def test_one_replica_killed_during_load(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL, token_delay_ms=10) for _ in range(3)]
    gateway = _gateway(gateways, [e.url for e in engines])
    killer = threading.Timer(0.3, engines[0].kill)
    killer.start()
    outcomes = asyncio.run(run_traffic(gateway.url, 60, max_tokens=30, spacing_s=0.015))
    killer.join()
    _check("replica killed during load", outcomes, {"ok", "sse:upstream_protocol"}, gateway, engines[1:])
    late = outcomes[40:]
    assert all(o.kind == "ok" for o in late), "once it is gone, new requests go elsewhere"


def test_all_replicas_down(gateways) -> None:
    gateway = _gateway(gateways, [f"http://127.0.0.1:{free_port()}" for _ in range(3)])
    outcomes = asyncio.run(run_traffic(gateway.url, REQUESTS))
    _check("all replicas down", outcomes, {"upstream_connect", "no_replica"}, gateway, [])
    after = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
    )
    assert after.status_code == 503 and after.headers["x-gateway-reject-reason"] == "no_replica"
    assert int(after.headers["retry-after"]) >= 1, "computed from the replicas' hold and probe timers"
