"""Admission control through real servers: per-replica caps hold, queues dispatch by priority, shed
paths answer the contract with a computed Retry-After, tenants are authenticated and limited."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from typing import Any

import httpx
import openai

from tests.integration.conftest import MODEL, pool
from tests.servers import free_port, gateway_settings, wait_until
from tests.waiting import eventually

CHAT = "/v1/chat/completions"


def _body(max_tokens: int = 2, stream: bool = False) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _contract(response: httpx.Response, status: int, reason: str) -> int:
    assert response.status_code == status, response.text
    assert response.headers["x-gateway-reject-reason"] == reason
    assert response.json()["error"]["code"] == reason
    retry_after = int(response.headers["retry-after"])
    assert retry_after >= 1
    return retry_after


def test_the_per_replica_cap_holds_and_queued_requests_all_finish(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL, token_delay_ms=5) for _ in range(2)]
    gateway = gateways(gateway_settings([pool(engines, max_concurrency_per_replica=2)]))

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as client:
            return await asyncio.gather(*(client.post(CHAT, json=_body(max_tokens=20)) for _ in range(20)))

    responses = asyncio.run(burst())
    assert {r.status_code for r in responses} == {200}
    assert max(e.app.counters.max_active for e in engines) <= 2
    assert any(int(r.headers["x-gateway-queue-ms"]) > 0 for r in responses), "some requests had to queue"
    assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)


def test_queue_timeout_and_queue_full(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=20)
    raw = gateway_settings([pool([engine], max_concurrency_per_replica=1)])
    raw["admission"] = {
        "classes": {
            "critical": {"max_wait_s": 5},
            "interactive": {"max_wait_s": 0.3},
            "batch": {"max_wait_s": 5},
        },
        "max_queue_depth": 1,
        "early_refusal_ratio": None,
    }
    gateway = gateways(raw)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        with client.stream("POST", CHAT, json=_body(max_tokens=300, stream=True)) as held:
            assert held.status_code == 200
            started = time.monotonic()
            timed_out = client.post(CHAT, json=_body())
            waited_s = time.monotonic() - started
            _contract(timed_out, 429, "queue_timeout")
            assert 0.25 <= waited_s < 2.0

            depth = gateway.app.state.metrics.queue_depth

            async def one_queued_one_refused() -> tuple[httpx.Response, httpx.Response]:
                async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as aclient:
                    batch = asyncio.create_task(
                        aclient.post(CHAT, json=_body(), headers={"x-gateway-priority": "batch"})
                    )
                    await eventually(
                        lambda: depth.labels(MODEL, "batch")._value.get() == 1, what="batch queued"
                    )
                    refused = await aclient.post(CHAT, json=_body(), headers={"x-gateway-priority": "batch"})
                    critical = asyncio.create_task(
                        aclient.post(CHAT, json=_body(), headers={"x-gateway-priority": "critical"})
                    )
                    displaced = await batch
                    critical.cancel()
                    return refused, displaced

            refused, displaced = asyncio.run(one_queued_one_refused())
            _contract(refused, 429, "queue_full")
            _contract(displaced, 429, "queue_full")
    assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)
    durations = gateway.app.state.metrics.rejection_duration_seconds
    assert wait_until(lambda: _histogram(durations, "queue_full")[0] == 2)
    count, sum_s = _histogram(durations, "queue_timeout")
    assert count == 1 and 0.25 <= sum_s < 2.0, "a queue timeout is timed from arrival to its 429"


def _histogram(histogram: Any, reason: str) -> tuple[float, float]:
    """(count, sum) of one label of a prometheus_client Histogram."""
    samples = {s.name: s.value for s in histogram.collect()[0].samples if s.labels.get("reason") == reason}
    prefix = "llm_gateway_rejection_duration_seconds"
    return samples.get(f"{prefix}_count", 0.0), samples.get(f"{prefix}_sum", 0.0)


def test_a_waiter_whose_client_leaves_is_never_dispatched(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=10)
    gateway = gateways(gateway_settings([pool([engine], max_concurrency_per_replica=1)]))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        with client.stream("POST", CHAT, json=_body(max_tokens=60, stream=True)) as held:
            with contextlib.suppress(httpx.ReadTimeout):
                httpx.post(gateway.url + CHAT, json=_body(max_tokens=5), timeout=0.2)
            depth = gateway.app.state.metrics.queue_depth
            assert wait_until(lambda: depth.labels(MODEL, "interactive")._value.get() == 0)
            for _ in held.iter_lines():
                pass
        # A probe behind the freed slot: had the abandoned waiter still been queued, it would have been
        # dispatched (FIFO, cap 1) before the probe could finish.
        assert client.post(CHAT, json=_body(max_tokens=1)).status_code == 200
    assert engine.app.counters.started == 2, "the held stream and the probe; the abandoned waiter never ran"


def test_no_replica_is_503_with_a_computed_retry_after(gateways) -> None:
    raw = gateway_settings(
        [
            {
                "model": MODEL,
                "replicas": {"static": [f"http://127.0.0.1:{free_port()}"]},
                "health": {"interval_s": 7, "unhealthy_threshold": 1},
            }
        ]
    )
    gateway = gateways(raw)
    first = httpx.post(gateway.url + CHAT, json=_body())
    assert first.status_code == 502
    second = httpx.post(gateway.url + CHAT, json=_body())
    retry_after = _contract(second, 503, "no_replica")
    assert retry_after <= 7


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_tenants_are_authenticated_rate_limited_and_clamped(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL)
    raw = gateway_settings([pool([engine])])
    raw["tenants"] = [
        {
            "name": "team-a",
            "api_key_hashes": [_key_hash("key-a")],
            "requests_per_min": 3,
            "priority_ceiling": "batch",
        },
        {"name": "team-b", "api_key_hashes": [_key_hash("key-b")]},
    ]
    gateway = gateways(raw)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        anonymous = client.post(CHAT, json=_body())
        assert anonymous.status_code == 401 and anonymous.headers["x-gateway-reject-reason"] == "unauthorized"
        wrong = client.post(CHAT, json=_body(), headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        a = {"authorization": "Bearer key-a", "x-gateway-priority": "critical"}
        assert [client.post(CHAT, json=_body(), headers=a).status_code for _ in range(3)] == [200, 200, 200]
        limited = client.post(CHAT, json=_body(), headers=a)
        retry_after = _contract(limited, 429, "rate_limited")
        assert 1 <= retry_after <= 20, "one request refills in 60 s / 3 = 20 s"
        assert client.post(CHAT, json=_body(), headers={"authorization": "Bearer key-b"}).status_code == 200
    metrics = gateway.app.state.metrics
    assert metrics.tenant_requests_total.labels("team-a", "rate_limited")._value.get() == 1
    counts = {
        s.labels["priority"]: s.value
        for s in metrics.queue_wait_seconds.collect()[0].samples
        if s.name.endswith("_count")
    }
    assert counts.get("batch") == 3 and "critical" not in counts, "team-a's critical was clamped to batch"


def test_the_connection_limit_queues_instead_of_failing_replicas(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=5)
    # The burst waits ~1.2 s in the queue: longer than the TTFT objective's default bound on waits.
    raw = gateway_settings([pool([engine], timeouts={"connect_s": 0.1}, slo={"queue_wait_ratio": None})])
    raw["upstream"] = {"max_connections": 2}
    gateway = gateways(raw)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as client:
            return await asyncio.gather(*(client.post(CHAT, json=_body(max_tokens=40)) for _ in range(12)))

    responses = asyncio.run(burst())
    assert {r.status_code for r in responses} == {200}, "requests beyond the limit wait, they do not fail"
    assert engine.app.counters.max_active <= 2, "never more than the limit in flight"
    assert all(
        r.breaker.state == "closed" and r.consecutive_connect_failures == 0
        for r in gateway.app.state.registry.all_replicas()
    ), "a local limit is not a replica failure"


def test_a_hopeless_wait_is_refused_at_arrival_not_after_it(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=20)
    raw = gateway_settings([pool([engine], max_concurrency_per_replica=1)])
    raw["admission"] = {"classes": {"interactive": {"max_wait_s": 0.3}}}
    gateway = gateways(raw)
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        # one request completes first: early refusal needs a measured hold time (~0.6 s here)
        assert client.post(CHAT, json=_body(max_tokens=30)).status_code == 200
        with client.stream("POST", CHAT, json=_body(max_tokens=300, stream=True)) as held:
            assert held.status_code == 200
            started = time.monotonic()
            refused = client.post(CHAT, json=_body())
            elapsed_s = time.monotonic() - started
            _contract(refused, 429, "queue_full")
            assert "limit" in refused.json()["error"]["message"]
            assert elapsed_s < 0.2, "refused at once, not after the 0.3 s class limit"
    durations = gateway.app.state.metrics.rejection_duration_seconds
    assert wait_until(lambda: _histogram(durations, "queue_full")[0] == 1)
    assert _histogram(durations, "queue_full")[1] < 0.2


def test_a_retry_sent_when_its_retry_after_said_claims_its_place(mock_engines, gateways) -> None:
    """The official client, honouring Retry-After: its refused request is booked a place in the retry
    lane, the header says when, and the identical body sent then claims it and is served."""
    engine = mock_engines(model=MODEL, token_delay_ms=20)
    raw = gateway_settings([pool([engine], max_concurrency_per_replica=1)])
    raw["admission"] = {"classes": {"interactive": {"max_wait_s": 0.3}}}
    gateway = gateways(raw)
    lane = gateway.app.state.metrics.retry_lane_total
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        # one request completes first: the hold time (~0.6 s) and so the pool's capacity are measured
        assert client.post(CHAT, json=_body(max_tokens=30)).status_code == 200
        with client.stream("POST", CHAT, json=_body(max_tokens=20, stream=True)) as held:  # ~0.4 s
            assert held.status_code == 200
            refused = client.post(CHAT, json=_body())
            assert _contract(refused, 429, "queue_full") == 1, "the lane's first place, a second out"
            assert "goes ahead of new arrivals" in refused.json()["error"]["message"]
            sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=1)
            started = time.monotonic()
            asked = {**_body(), "messages": [{"role": "user", "content": "another question"}]}
            answer = sdk.chat.completions.with_raw_response.create(**asked)  # refused, then booked
            waited_s = time.monotonic() - started
            for _ in held.iter_lines():
                pass
    assert answer.http_response.status_code == 200
    assert 0.9 <= waited_s < 5, "the client slept the Retry-After once"
    assert lane.labels(MODEL, "promised")._value.get() == 2
    assert lane.labels(MODEL, "claimed")._value.get() == 1, "the client's retry claimed its place"
    assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)


def test_critical_takes_the_place_batch_holds_under_a_learned_cap(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=20)
    gateway = gateways(gateway_settings([pool([engine], latency_model={"adaptive_cap": False})]))
    (replica,) = gateway.app.state.registry.all_replicas()
    replica.cost.learned_cap = 1  # a cap the engine taught; frozen here (adaptive_cap off moves none)
    depth = gateway.app.state.metrics.queue_depth
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        batch = _body(max_tokens=300, stream=True)
        with client.stream("POST", CHAT, json=batch, headers={"x-gateway-priority": "batch"}) as held:
            assert held.status_code == 200
            assert (replica.inflight_requests, replica.lowest_class_inflight) == (1, 1)

            async def interactive_waits_critical_does_not() -> httpx.Response:
                async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as aclient:
                    headers = {"x-gateway-priority": "interactive"}
                    waiting = asyncio.create_task(aclient.post(CHAT, json=_body(), headers=headers))
                    queued = depth.labels(MODEL, "interactive")
                    await eventually(lambda: queued._value.get() == 1, what="interactive queued")
                    top = {"x-gateway-priority": "critical"}
                    critical = await aclient.post(CHAT, json=_body(), headers=top)
                    assert not waiting.done(), "the middle class still waits for the cap"
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
                    return critical

            critical = asyncio.run(interactive_waits_critical_does_not())
            assert critical.status_code == 200, critical.text
            assert int(critical.headers["x-gateway-queue-ms"]) < 1000, "served beside batch, not after it"
    assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)
    assert replica.lowest_class_inflight == 0
