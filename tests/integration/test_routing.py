"""Cache-aware routing through real servers: affinity holds for a shared prefix, and a hot prefix
spills to the next replica on the ring once its owner is over the bound."""

from __future__ import annotations

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import gateway_settings, wait_until

SYSTEM = "You are a meticulous assistant for the fleet operations team. " * 20


def _chat(question: str, **extra: object) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 2,
        **extra,
    }


def _route(response: httpx.Response) -> dict[str, str]:
    return dict(part.split("=", 1) for part in response.headers["x-gateway-route"].split("; "))


def test_same_system_prompt_lands_on_the_same_replica(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(3)]
    gateway = gateways(gateway_settings([pool(engines, policy="prefix-affinity")]))
    replicas = set()
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for i in range(12):
            response = client.post("/v1/chat/completions", json=_chat(f"question {i}"))
            assert response.status_code == 200
            assert _route(response)["branch"] == "ring_hit"
            replicas.add(response.headers["x-gateway-replica"])
    assert len(replicas) == 1


def test_hot_prefix_spills_to_the_next_ring_replica_when_over_bound(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL, token_delay_ms=20) for _ in range(3)]
    gateway = gateways(gateway_settings([pool(engines, policy="prefix-affinity")]))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        owner = client.post("/v1/chat/completions", json=_chat("warm")).headers["x-gateway-replica"]
        long_body = _chat("hold", stream=True, max_tokens=500)
        with client.stream("POST", "/v1/chat/completions", json=long_body) as held:
            assert held.headers["x-gateway-replica"] == owner
            spilled = client.post("/v1/chat/completions", json=_chat("while busy"))
            route = _route(spilled)
            assert route["branch"] == "spillover" and int(route["hops"]) >= 1
            assert spilled.headers["x-gateway-replica"] != owner
        assert wait_until(lambda: gateway.app.state.registry.total_inflight() == 0)
        after = client.post("/v1/chat/completions", json=_chat("after"))
        assert after.headers["x-gateway-replica"] == owner, "affinity returns once the owner is under bound"
    samples = gateway.app.state.metrics.routing_decisions_total.collect()[0].samples
    branches = {s.labels["branch"]: s.value for s in samples if s.name.endswith("_total")}
    assert branches["spillover"] == 1 and branches["ring_hit"] >= 2


def test_session_affinity_follows_the_session_header(mock_engines, gateways) -> None:
    engines = [mock_engines(model=MODEL) for _ in range(3)]
    gateway = gateways(gateway_settings([pool(engines, policy="session-affinity")]))
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        seen = {
            client.post(
                "/v1/chat/completions", json=_chat(f"turn {i}"), headers={"x-session-id": "conv-1"}
            ).headers["x-gateway-replica"]
            for i in range(6)
        }
        assert len(seen) == 1
        no_session = client.post("/v1/chat/completions", json=_chat("anon"))
        assert _route(no_session)["branch"] == "session_none"
