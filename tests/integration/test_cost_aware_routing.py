"""Cost-aware routing through real servers: the latency model learns from streamed requests, the
SLO-aware policy routes on its predictions once warm (and says so in `x-gateway-route`), token-aware
load returns to zero, and a malformed objective header is a 400."""

from __future__ import annotations

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings, wait_until

SYSTEM = "You are a meticulous assistant for the fleet operations team. " * 20


def _chat(question: str, **extra: object) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 6,
        "stream": True,
        **extra,
    }


def _route(response: httpx.Response) -> dict[str, str]:
    return dict(part.split("=", 1) for part in response.headers["x-gateway-route"].split("; "))


def _stream(client: httpx.Client, question: str, headers: dict[str, str] | None = None) -> httpx.Response:
    with client.stream("POST", "/v1/chat/completions", json=_chat(question), headers=headers) as response:
        response.read()
    assert response.status_code == 200, response.text
    return response


def test_predicted_latency_routes_on_the_learned_model_once_warm(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL, first_token_delay_ms=20, token_delay_ms=2) for _ in range(2)]
    settings = pool(engines, policy="predicted-latency", latency_model={"warm_after": 4})
    gateway = gateways(gateway_settings([settings]))
    branches = []
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for i in range(16):
            branches.append(_route(_stream(client, f"question {i}"))["branch"])
        assert branches[0] == "cold_model"
        warm = _stream(client, "after warm-up", headers={"x-slo-ttft-ms": "5000", "x-slo-tpot-ms": "500"})
        route = _route(warm)
        assert route["branch"] == "slo_met", route
        assert 1 <= float(route["predicted_ttft_ms"]) < 5000
        assert float(route["predicted_tpot_ms"]) > 0
        tight = _stream(client, "impossible objective", headers={"x-slo-ttft-ms": "1"})
        assert _route(tight)["branch"] == "slo_best_effort"
        metrics = client.get("/metrics").text
    assert 'llm_gateway_latency_model_error_ratio{replica="' in metrics
    state = gateway.app.state
    assert wait_until(lambda: state.registry.total_inflight() == 0)
    samples = 0
    for replica in state.registry.all_replicas():
        assert (replica.cost.prefill_tokens_inflight, replica.cost.decoding_requests) == (0, 0)
        assert replica.cost.model is not None
        samples += replica.cost.model.ttft.samples
        # the relay noted each replica's streamed tokens (the phase of its step, a TTFT input)
        assert (replica.cost.last_token_s is not None) == (replica.cost.model.ttft.samples > 0)
    assert samples == 18  # every streamed request taught its replica's model its TTFT


def test_a_malformed_objective_header_is_a_400(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL)]
    gateway = gateways(gateway_settings([pool(engines)]))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for name, value in (("x-slo-ttft-ms", "soon"), ("x-slo-tpot-ms", "0")):
            body = _chat("q", stream=False)
            response = client.post("/v1/chat/completions", json=body, headers={name: value})
            assert response.status_code == 400
            assert response.headers["x-gateway-reject-reason"] == "bad_request"
            assert name in response.json()["error"]["message"]


def test_sticky_prefix_holds_a_shared_prefix_on_one_replica(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(3)]
    gateway = gateways(gateway_settings([pool(engines, policy="sticky-prefix")]))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        responses = [_stream(client, f"question {i}") for i in range(8)]
    assert len({r.headers["x-gateway-replica"] for r in responses}) == 1
    assert [_route(r)["branch"] for r in responses[1:]] == ["sticky"] * 7
