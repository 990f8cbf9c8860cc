"""The fault matrix (issue 6): for each fault, concurrent mixed traffic through a real gateway in front
of real mock engines, and the same promises every time — no request outlives its deadlines, every one
ends in success or a documented error, retries stay within budget, in-flight counts return to zero."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from mock_engine.faults import FaultSettings
from router.eligibility import is_routable
from tests.faults.conftest import MATRIX
from tests.faults.surface_traffic import MESSAGES, RESPONSES, SurfaceOutcome, run_surface_traffic
from tests.faults.traffic import MODEL, VIOLATIONS, Outcome, run_traffic, tally
from tests.servers import ServerThread, free_port, gateway_settings, wait_until

REQUESTS = 40
TIMEOUTS = {"connect_s": 0.5, "ttft_s": 0.6, "idle_s": 0.4, "nonstream_s": 2.0}
RETRIES = {"max_attempts": 3, "backoff_initial_s": 0.01, "backoff_max_s": 0.05}
BUDGET_FLOOR_RETRIES = 5  # budget_min_per_s 0.5 × 10 s window
# Worst case for one request: every attempt waits its full deadline, plus backoffs and slack.
DEADLINE_BOUND_S = RETRIES["max_attempts"] * TIMEOUTS["nonstream_s"] + 1.5


def _gateway(
    gateways: Callable[[dict[str, Any]], ServerThread], urls: list[str], **overrides: Any
) -> ServerThread:
    pool = {
        "model": MODEL,
        "replicas": {"static": urls},
        "policy": "least-load",
        "timeouts": TIMEOUTS,
        "retries": RETRIES,
        "breaker": {"consecutive_failures": 3, "open_s": 0.5, "max_open_s": 2},
        # a probe may take 2 s: on a busy CI machine a 0.3 s bound once marked all three down at once
        # (40 × no_replica); a killed or refusing replica still fails its probe at once
        "health": {"interval_s": 0.3, "unhealthy_threshold": 1, "healthy_threshold": 1, "timeout_s": 2.0},
        "scrape": {"enabled": False},
        **overrides,
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


# The Responses and Anthropic Messages streams (issue 16). The relay holds a stream's bytes until its
# first content event (a Responses `response.*.delta`, a Messages `content_block_delta`), so a stall
# before it is a TTFT timeout before the first byte: another replica is tried, and when every try stalls
# the client gets a 504 `upstream_ttft_timeout` in the surface's error shape, never a started stream.
# (The engine sends its first events — `response.created`, `message_start` — at once, so the idle
# timeout also runs before the first content event: these rows set it above the TTFT deadline, as the
# defaults are (15 s, 30 s); with this matrix's 0.4 s idle timeout the same stall ends as a 504
# `upstream_idle_timeout`.)
# A break after the first event ends with the surface's terminal `event: error`: the pool continues
# broken chat/completions streams (vLLM flavour), but there is no continuation for these two surfaces
# (gateway.proxy.continuation builds none), so none is counted.
SURFACE_REQUESTS = 12
LOST_AT_ONCE = {"response_state_lost", "upstream_connect", "no_replica"}
"""A stored response's replica killed a moment ago: the pinned try cannot connect (502, not retried on
another replica: the pin excludes them), or the gateway has already marked it down (404), or it went down
between the pin and the routing (503)."""
SURFACE_ERRORS = {
    # surface -> (the 504 of an idle timeout, the 502 of a reset) as the terminal event names them
    RESPONSES: ("sse:upstream_idle_timeout", "sse:upstream_protocol"),
    MESSAGES: ("sse:timeout_error", "sse:api_error"),
}


def _continuations(gateway: ServerThread) -> float:
    return float(gateway.app.state.metrics.stream_continuations_total.labels(MODEL)._value.get())


@pytest.mark.parametrize("surface", [RESPONSES, MESSAGES])
@pytest.mark.parametrize("faulty", [1, 3], ids=["one of three", "all three"])
def test_a_surface_stream_stalled_before_its_first_event(surface: str, faulty: int, mock_engines, gateways):
    engines = _fleet(mock_engines, FaultSettings(stall_after_tokens=0), faulty=faulty)
    gateway = _gateway(gateways, [e.url for e in engines])
    idle_over_ttft = {"x-gateway-idle-timeout-ms": "1500"}
    outcomes = asyncio.run(
        run_surface_traffic(gateway.url, surface, SURFACE_REQUESTS, headers=idle_over_ttft)
    )
    name = f"{surface} stream: stall before the first event ({faulty} of 3)"
    if faulty == 3:  # every try stalls: the 504 before any byte, in the surface's shape
        _check(name, outcomes, {"upstream_ttft_timeout"}, gateway, engines)
        return
    _check(name, outcomes, {"ok", "upstream_ttft_timeout"}, gateway, engines)
    assert tally(outcomes)["ok"] >= SURFACE_REQUESTS // 2, "a stalled try fails over before the first byte"


ROUND_ROBIN = {"policy": "round-robin", "health": {"interval_s": 0.5, "timeout_s": 2.0}}
"""Mid-stream rows: every replica in turn, so the faulty one surely gets its share; health checks that a
busy machine does not fail (a replica out of rotation would get nothing to break)."""


@pytest.mark.parametrize("surface", [RESPONSES, MESSAGES])
@pytest.mark.parametrize("fault", ["stall", "reset"])
def test_a_surface_stream_broken_mid_way(surface: str, fault: str, mock_engines, gateways) -> None:
    faults = FaultSettings(stall_after_tokens=3) if fault == "stall" else FaultSettings(crash_after_tokens=3)
    engines = _fleet(mock_engines, faults)
    gateway = _gateway(gateways, [e.url for e in engines], **ROUND_ROBIN)
    outcomes = asyncio.run(run_surface_traffic(gateway.url, surface, SURFACE_REQUESTS))
    terminal = SURFACE_ERRORS[surface][0 if fault == "stall" else 1]
    _check(f"{surface} stream: {fault} mid-stream", outcomes, {"ok", terminal}, gateway, engines)
    counters = engines[0].app.counters
    broken = counters.stalled_injected if fault == "stall" else counters.crashed_injected
    assert broken >= 1, "the faulty replica broke streams"
    assert tally(outcomes) == {"ok": SURFACE_REQUESTS - broken, terminal: broken}, "one terminal event each"
    assert _continuations(gateway) == 0, "these surfaces are not continued: the terminal event ends them"


def test_a_stored_response_whose_replica_is_gone(mock_engines, gateways) -> None:
    """Chained Responses streams after the replica holding some of the stored responses is killed: the
    others continue on their replica; the lost ones are never answered by another replica — a
    documented error at once (`LOST_AT_ONCE`; mostly 502 `upstream_connect`), then 404
    `response_state_lost` for every one once the gateway has marked the replica down."""
    engines = [mock_engines(model=MODEL, token_delay_ms=5) for _ in range(3)]
    patient = {"interval_s": 0.3, "unhealthy_threshold": 1, "healthy_threshold": 1, "timeout_s": 2.0}
    gateway = _gateway(gateways, [e.url for e in engines], health=patient)  # a killed one fails at once
    first = asyncio.run(run_surface_traffic(gateway.url, RESPONSES, SURFACE_REQUESTS, max_tokens=4))
    assert tally(first) == {"ok": SURFACE_REQUESTS}
    held = Counter(o.replica for o in first)
    gone = held.most_common(1)[0][0]
    (victim,) = [e for e in engines if e.url.endswith(f":{gone.rpartition(':')[2]}")]
    victim.kill()
    previous: list[str | None] = [o.response_id for o in first]
    lost = {i for i, o in enumerate(first) if o.replica == gone}

    def chained() -> list[SurfaceOutcome]:
        return asyncio.run(
            run_surface_traffic(gateway.url, RESPONSES, SURFACE_REQUESTS, max_tokens=4, previous_ids=previous)
        )

    right_away = chained()
    pool = gateway.app.state.registry.pool(MODEL)

    def routable() -> bool:
        return any(v.replica_id == gone and is_routable(v) for v in pool.snapshot())

    assert wait_until(lambda: not routable(), timeout_s=3), "the kill was noticed"
    noticed = chained()
    live = [e for e in engines if e is not victim]
    for name, outcomes, allowed_lost in (
        ("responses: replica gone for a stored response (at once)", right_away, LOST_AT_ONCE),
        ("responses: replica gone for a stored response (noticed)", noticed, {"response_state_lost"}),
    ):
        _check(name, outcomes, {"ok", *allowed_lost}, gateway, live)
        for i, outcome in enumerate(outcomes):
            if i in lost:
                assert outcome.kind in allowed_lost, (name, outcome)
            else:
                assert (outcome.kind, outcome.replica) == ("ok", first[i].replica), (name, outcome)
    assert Counter(o.kind for i, o in enumerate(noticed) if i in lost) == {"response_state_lost": len(lost)}
