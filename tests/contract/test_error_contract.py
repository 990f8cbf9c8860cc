"""The error contract (DESIGN §4): for each row of the table that a gateway in front of mock engines can
produce, the status, `x-gateway-reject-reason`, the OpenAI-style body `{"error": {message, type, code}}`
and `Retry-After` (an integer ≥ 1) exactly where the table has one.

Not produced here: `internal_error` (a bug), `request_quarantined` and `response_not_found` (surfaces
this gateway does not serve yet). The terminal SSE events of streams that started are in
`test_stream_errors.py` (and `draining`'s at the end of this file).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from tests.contract.conftest import (
    CHAT,
    CLIENT_TIMEOUT,
    DEAD,
    FAILOVER,
    FREE_KEY,
    LIMITED_KEYS,
    MODEL,
    SILENT,
    SILENT_TTFT_S,
    SLOW,
    SLOW_NONSTREAM_S,
    UPSTREAM_500,
    UPSTREAM_503,
    UPSTREAM_RETRY_AFTER_S,
    ContractGateway,
    assert_error,
    bearer,
    chat,
    engine_stats,
    metric_samples,
    metric_value,
    replica_id,
    retry_after_s,
)
from tests.servers import ServerThread, gateway_settings
from tests.waiting import eventually, wait_for

A_FEW_SECONDS = 10  # the table's Retry-After for `draining` and `state_unavailable`

# --- the request itself -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "'model'"),
        (b'{"model": 3, "messages": []}', "'model'"),
        (b'{"model": "test-model", "messages": "hi"}', "'messages'"),
        (b'{"model": "test-model", "messages": [{"role": "user"}], "stream": "yes"}', "'stream'"),
        (b'{"model": "test-model", "messages": [{"role": "user"}], "max_tokens": -1}', "'max_tokens'"),
    ],
)
def test_bad_request(contract_gateway: ContractGateway, body: bytes, fragment: str) -> None:
    response = httpx.post(contract_gateway.url + CHAT, content=body)
    error = assert_error(response, 400, "bad_request", retry_after=False)
    assert fragment in error["message"]


def test_a_malformed_timeout_override_is_a_bad_request(contract_gateway: ContractGateway) -> None:
    response = httpx.post(
        contract_gateway.url + CHAT, json=chat(), headers={"x-gateway-ttft-timeout-ms": "soon"}
    )
    error = assert_error(response, 400, "bad_request", retry_after=False)
    assert "x-gateway-ttft-timeout-ms" in error["message"]


def test_unknown_model(contract_gateway: ContractGateway) -> None:
    response = httpx.post(contract_gateway.url + CHAT, json=chat("gpt-9"))
    assert_error(response, 404, "model_not_found", retry_after=False)


def test_body_too_large(contract_gateway: ContractGateway) -> None:
    huge = b'{"model": "test-model", "prompt": "' + b"x" * (4 * 1024 * 1024 + 1) + b'"}'
    response = httpx.post(contract_gateway.url + "/v1/completions", content=huge)
    assert_error(response, 413, "too_large", retry_after=False)


def test_unknown_route_and_method(contract_gateway: ContractGateway) -> None:
    assert_error(httpx.get(contract_gateway.url + "/v1/nothing"), 404, "not_found", retry_after=False)
    wrong = httpx.get(contract_gateway.url + CHAT)
    assert_error(wrong, 405, "method_not_allowed", retry_after=False)
    assert wrong.headers["allow"] == "POST", "RFC 9110: a 405 names the methods the path answers"
    ops = httpx.post(contract_gateway.url + "/readyz")
    assert_error(ops, 405, "method_not_allowed", retry_after=False)
    assert ops.headers["allow"] == "GET"


# --- tenants: authentication and rate limits --------------------------------------------------------


def test_missing_or_invalid_api_key(tenant_gateway: ServerThread) -> None:
    with httpx.Client(base_url=tenant_gateway.url, timeout=CLIENT_TIMEOUT) as client:
        assert_error(client.post(CHAT, json=chat()), 401, "unauthorized", retry_after=False)
        wrong = client.post(CHAT, json=chat(), headers=bearer("nope"))
        assert_error(wrong, 401, "unauthorized", retry_after=False)
        assert client.post(CHAT, json=chat(), headers=bearer(FREE_KEY)).status_code == 200


def test_rate_limited_retry_after_is_the_bucket_refill_time(tenant_gateway: ServerThread) -> None:
    with httpx.Client(base_url=tenant_gateway.url, timeout=CLIENT_TIMEOUT) as client:
        for key, per_min in LIMITED_KEYS.items():
            answers = [client.post(CHAT, json=chat(), headers=bearer(key)) for _ in range(per_min + 1)]
            assert [a.status_code for a in answers[:-1]] == [200] * per_min
            assert_error(answers[-1], 429, "rate_limited", retry_after=True)
            refill_s = 60 // per_min
            assert refill_s - 2 <= retry_after_s(answers[-1]) <= refill_s, (
                "one request refills in 60 s / limit"
            )
        assert client.post(CHAT, json=chat(), headers=bearer(FREE_KEY)).status_code == 200


# --- admission queues --------------------------------------------------------------------------------


def test_queue_timeout(queue_gateway: ServerThread) -> None:
    _wait_idle(queue_gateway)
    with httpx.Client(base_url=queue_gateway.url, timeout=CLIENT_TIMEOUT) as client:
        with client.stream("POST", CHAT, json=chat(max_tokens=300, stream=True)) as held:
            assert held.status_code == 200
            started = time.monotonic()
            timed_out = client.post(CHAT, json=chat())
            waited_s = time.monotonic() - started
        assert_error(timed_out, 429, "queue_timeout", retry_after=True)
        assert 0.25 <= waited_s < 2.0, "refused once the interactive class's 0.3 s max wait had passed"


def test_queue_full_at_arrival_and_by_displacement(queue_gateway: ServerThread) -> None:
    """Depth 1: a second batch request is refused at once; a critical one displaces the queued batch one
    and, once the slot frees, is served with its queue time in the headers."""

    _wait_idle(queue_gateway)

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=queue_gateway.url, timeout=CLIENT_TIMEOUT) as client:
            request = client.build_request("POST", CHAT, json=chat(max_tokens=300, stream=True))
            held = await client.send(request, stream=True)
            assert held.status_code == 200
            batch = {"x-gateway-priority": "batch"}
            queued = asyncio.create_task(client.post(CHAT, json=chat(), headers=batch))
            await eventually(
                lambda: _queue_depth(queue_gateway, "batch") == 1, what="the batch request queued"
            )
            refused = await client.post(CHAT, json=chat(), headers=batch)
            critical = asyncio.create_task(
                client.post(CHAT, json=chat(), headers={"x-gateway-priority": "critical"})
            )
            displaced = await queued
            await held.aclose()  # frees the slot: the critical request is dispatched
            return refused, displaced, await critical

    refused, displaced, served = asyncio.run(scenario())
    assert_error(refused, 429, "queue_full", retry_after=True)
    assert_error(displaced, 429, "queue_full", retry_after=True)
    assert served.status_code == 200
    queue_ms = int(served.headers["x-gateway-queue-ms"])
    assert queue_ms >= 1, "it waited for the held stream's slot"
    timing = dict(part.split(";dur=") for part in served.headers["server-timing"].split(", "))
    assert abs(float(timing["queue"]) - queue_ms) <= 1.0, "Server-Timing's queue is x-gateway-queue-ms"
    depth = metric_samples(queue_gateway.url)["llm_gateway_queue_depth"]
    assert {frozenset(labels) for labels, _ in depth} == {frozenset({"model", "priority"})}


def _queue_depth(gateway: ServerThread, priority: str) -> float:
    return metric_value(gateway.url, "llm_gateway_queue_depth", model=MODEL, priority=priority)


def _wait_idle(gateway: ServerThread) -> None:
    """Until nothing is in flight (a previous test's held stream has released its slot)."""
    wait_for(
        lambda: sum(v for _, v in metric_samples(gateway.url).get("llm_gateway_inflight", [])) == 0,
        what="the queue gateway is idle",
    )


# --- upstream failures -------------------------------------------------------------------------------


def test_upstream_connect_failure_then_no_replica(contract_gateway: ContractGateway) -> None:
    url = contract_gateway.url
    retries_before = metric_value(url, "llm_gateway_retries_total", reason="connect")
    first = httpx.post(url + CHAT, json=chat(DEAD))
    assert_error(first, 502, "upstream_connect", retry_after=False)
    retries = metric_value(url, "llm_gateway_retries_total", reason="connect") - retries_before
    assert retries == 1, "two replicas, two attempts: one retry"
    second = httpx.post(url + CHAT, json=chat(DEAD))
    assert_error(second, 503, "no_replica", retry_after=True)
    # the soonest timer that brings a replica back (the short hold after a connect failure), not a cap
    assert retry_after_s(second) <= 2
    for dead in contract_gateway.dead_urls:
        assert metric_value(url, "llm_gateway_inflight", replica=replica_id(dead)) == 0


def test_connect_failure_fails_over_to_a_live_replica(contract_gateway: ContractGateway) -> None:
    [live] = contract_gateway.engines[FAILOVER]
    for _ in range(4):
        response = httpx.post(contract_gateway.url + CHAT, json=chat(FAILOVER))
        assert response.status_code == 200
        assert response.headers["x-gateway-replica"] == replica_id(live.url)


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_status_passes_through_then_the_replica_is_held_for_its_retry_after(
    contract_gateway: ContractGateway, stream: bool
) -> None:
    model = UPSTREAM_503[stream]
    [engine] = contract_gateway.engines[model]
    response = httpx.post(contract_gateway.url + CHAT, json=chat(model, stream=stream))
    assert response.status_code == 503
    assert response.headers["x-gateway-reject-reason"] == "upstream_status"
    assert response.headers["retry-after"] == str(UPSTREAM_RETRY_AFTER_S), "the upstream's own Retry-After"
    error = response.json()["error"]
    assert error["message"] == "injected fault", "the engine's own body is passed through"
    assert engine_stats(engine)["failed_injected"] == 1
    held = httpx.post(contract_gateway.url + CHAT, json=chat(model, stream=stream))
    assert_error(held, 503, "no_replica", retry_after=True)
    assert retry_after_s(held) <= UPSTREAM_RETRY_AFTER_S, "at most what is left of the replica's hold"
    assert engine_stats(engine)["failed_injected"] == 1, "the held replica was not called again"


def test_upstream_status_without_retry_after_has_none(contract_gateway: ContractGateway) -> None:
    response = httpx.post(contract_gateway.url + CHAT, json=chat(UPSTREAM_500))
    assert response.status_code == 500
    assert response.headers["x-gateway-reject-reason"] == "upstream_status"
    assert "retry-after" not in response.headers
    assert response.json()["error"]["message"] == "injected fault"


def test_ttft_timeout_after_retries_when_no_replica_sends_anything(contract_gateway: ContractGateway) -> None:
    url = contract_gateway.url
    retries_before = metric_value(url, "llm_gateway_retries_total", reason="ttft_timeout")
    started = time.monotonic()
    response = httpx.post(url + CHAT, json=chat(SILENT, stream=True))
    elapsed_s = time.monotonic() - started
    assert_error(response, 504, "upstream_ttft_timeout", retry_after=False)
    retries = metric_value(url, "llm_gateway_retries_total", reason="ttft_timeout") - retries_before
    assert retries == 1, "two silent replicas, two attempts: one retry"
    assert elapsed_s < 2 * SILENT_TTFT_S + 1.0, "each attempt bounded by the first-token deadline"


def test_ttft_timeout_when_the_first_token_is_late(contract_gateway: ContractGateway) -> None:
    headers = {"x-gateway-ttft-timeout-ms": "200"}
    response = httpx.post(
        contract_gateway.url + CHAT, json=chat(SLOW, stream=True), headers=headers, timeout=CLIENT_TIMEOUT
    )
    assert_error(response, 504, "upstream_ttft_timeout", retry_after=False)


def test_non_streamed_response_past_its_total_bound(contract_gateway: ContractGateway) -> None:
    started = time.monotonic()
    response = httpx.post(contract_gateway.url + CHAT, json=chat(SLOW), timeout=CLIENT_TIMEOUT)
    elapsed_s = time.monotonic() - started
    assert elapsed_s < SLOW_NONSTREAM_S + 1.0, "bounded by timeouts.nonstream_s"
    assert_error(response, 504, "upstream_total_timeout", retry_after=False)


# --- shared state down (fail_closed) -----------------------------------------------------------------


def test_state_unavailable_when_redis_is_down_and_fail_closed(state_down_gateway: ServerThread) -> None:
    headers = {**bearer(FREE_KEY), "idempotency-key": "order-1"}
    response = httpx.post(state_down_gateway.url + CHAT, json=chat(), headers=headers)
    assert_error(response, 503, "state_unavailable", retry_after=True)
    assert retry_after_s(response) <= A_FEW_SECONDS
    served = httpx.post(state_down_gateway.url + CHAT, json=chat(), headers=bearer(FREE_KEY))
    assert served.status_code == 200, "a request that needs no shared state is still served"


def test_state_unavailable_for_a_rate_limited_tenant(state_down_gateway: ServerThread) -> None:
    response = httpx.post(state_down_gateway.url + CHAT, json=chat(), headers=bearer("key-three"))
    assert_error(response, 503, "state_unavailable", retry_after=True)


# --- the gateway shutting down -----------------------------------------------------------------------


def test_draining_refuses_new_requests_and_ends_running_streams(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=10)
    raw = gateway_settings([{"model": MODEL, "replicas": {"static": [engine.url]}, "policy": "least-load"}])
    raw["server"]["drain_timeout_s"] = 0.3
    gateway = gateways(raw)
    with (
        httpx.Client(base_url=gateway.url, timeout=CLIENT_TIMEOUT) as client,
        client.stream("POST", CHAT, json=chat(max_tokens=5000, stream=True)) as running,
    ):
        assert running.status_code == 200
        drain = threading.Thread(target=lambda: gateway.call(gateway.app.drain()))
        drain.start()
        wait_for(lambda: client.get("/readyz").status_code == 503, what="readiness went false")
        refused = client.post(CHAT, json=chat())
        lines = [line for line in running.iter_lines() if line]
        drain.join(10)
    assert_error(refused, 503, "draining", retry_after=True)
    assert retry_after_s(refused) <= A_FEW_SECONDS
    # the stream outlived drain_timeout_s: it ends with one terminal error event, not a silent cut
    assert "data: [DONE]" not in lines and lines[-1].startswith("data: {"), lines[-1]
    error = orjson.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == "draining" and error["message"] and error["type"]
