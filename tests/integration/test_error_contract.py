"""The error contract (DESIGN §4): status, `x-gateway-reject-reason`, `Retry-After`, OpenAI error body."""

from __future__ import annotations

import httpx
import pytest

from mock_engine.faults import FaultSettings
from tests.integration.conftest import MODEL, Fleet, pool
from tests.servers import free_port, gateway_settings

CHAT = "/v1/chat/completions"


def _assert_contract(response: httpx.Response, status: int, reason: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["x-gateway-reject-reason"] == reason
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == reason and error["message"] and error["type"]
    return error


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
def test_bad_request(fleet: Fleet, body: bytes, fragment: str) -> None:
    response = httpx.post(fleet.gateway.url + CHAT, content=body)
    error = _assert_contract(response, 400, "bad_request")
    assert fragment in error["message"]
    assert "retry-after" not in response.headers


def test_unknown_model(fleet: Fleet) -> None:
    response = httpx.post(
        fleet.gateway.url + CHAT, json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}
    )
    _assert_contract(response, 404, "model_not_found")


def test_body_too_large(fleet: Fleet) -> None:
    huge = b'{"model": "test-model", "prompt": "' + b"x" * (4 * 1024 * 1024 + 1) + b'"}'
    _assert_contract(httpx.post(fleet.gateway.url + "/v1/completions", content=huge), 413, "too_large")


def test_unknown_route_and_method(fleet: Fleet) -> None:
    _assert_contract(httpx.get(fleet.gateway.url + "/v1/nothing"), 404, "not_found")
    _assert_contract(httpx.get(fleet.gateway.url + CHAT), 405, "method_not_allowed")


def test_upstream_connect_failure_then_no_replica(gateways) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    gateway = gateways(gateway_settings([{"model": MODEL, "replicas": {"static": dead}}]))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    first = httpx.post(gateway.url + CHAT, json=body)
    _assert_contract(first, 502, "upstream_connect")
    retries = gateway.app.state.metrics.retries_total.labels("connect")._value.get()
    assert retries == 1, "two replicas, two attempts: one retry"
    second = httpx.post(gateway.url + CHAT, json=body)
    _assert_contract(second, 503, "no_replica")
    assert int(second.headers["retry-after"]) >= 1
    assert all(r.inflight_requests == 0 for r in gateway.app.state.registry.all_replicas())


def test_connect_failure_fails_over_to_a_live_replica(mock_engines, gateways) -> None:
    live = mock_engines(model=MODEL)
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = gateways(
        gateway_settings([pool([live], policy="round-robin", replicas={"static": [dead, live.url]})])
    )
    for _ in range(4):
        response = httpx.post(
            gateway.url + CHAT, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        )
        assert response.status_code == 200
        assert response.headers["x-gateway-replica"] == live.url.removeprefix("http://")


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_status_passes_through(mock_engines, gateways, stream: bool) -> None:
    engine = mock_engines(
        model=MODEL, faults=FaultSettings(error_rate=1.0, error_status=503, retry_after_s=7)
    )
    gateway = gateways(gateway_settings([pool([engine])]))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": stream}
    response = httpx.post(gateway.url + CHAT, json=body)
    assert response.status_code == 503
    assert response.headers["x-gateway-reject-reason"] == "upstream_status"
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["message"] == "injected fault", "the engine's own body is passed through"
    assert engine.app.counters.failed_injected == 1
