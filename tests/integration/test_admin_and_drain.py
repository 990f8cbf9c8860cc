"""Admin API (drain/undrain a replica) and gateway drain on shutdown, against real servers."""

from __future__ import annotations

import threading

import httpx

from tests.integration.conftest import MODEL, pool
from tests.servers import free_port, gateway_settings
from tests.waiting import wait_for

ADMIN_KEY = "s3cret-admin"
CHAT = "/v1/chat/completions"


def _body(**extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


def test_admin_api_is_closed_without_a_key(monkeypatch, fleet) -> None:
    monkeypatch.delenv("LLM_GATEWAY_ADMIN_KEY", raising=False)
    response = httpx.get(fleet.gateway.url + "/admin/replicas")
    assert response.status_code == 404 and response.headers["x-gateway-reject-reason"] == "not_found"


def test_admin_requires_the_key_and_drains_a_replica(monkeypatch, mock_engines, gateways) -> None:
    monkeypatch.setenv("LLM_GATEWAY_ADMIN_KEY", ADMIN_KEY)
    engines = [mock_engines(model=MODEL, token_delay_ms=20) for _ in range(2)]
    gateway = gateways(gateway_settings([pool(engines, policy="round-robin")]))
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        denied = client.get("/admin/replicas", headers={"authorization": "Bearer wrong"})
        assert denied.status_code == 401 and denied.headers["x-gateway-reject-reason"] == "unauthorized"
        with client.stream("POST", CHAT, json=_body(stream=True, max_tokens=200)) as held:
            held_replica = held.headers["x-gateway-replica"]
            drained = client.post(f"/admin/replicas/{held_replica}/drain", headers=auth).json()["replicas"][0]
            assert drained["draining"] and drained["inflight_requests"] == 1 and not drained["drained"]
            for _ in range(6):
                other = client.post(CHAT, json=_body())
                assert other.status_code == 200 and other.headers["x-gateway-replica"] != held_replica
            lines = [line for line in held.iter_lines() if line]
            assert lines[-1] == "data: [DONE]", "the draining replica's in-flight stream finishes"

        def replica_status() -> dict:
            answer = client.get(f"/admin/replicas/{held_replica}", headers=auth).json()
            status: dict = answer["replicas"][0]
            return status

        wait_for(lambda: replica_status()["drained"], timeout_s=2, what="the drained replica reports drained")
        assert replica_status()["inflight_requests"] == 0
        client.post(f"/admin/replicas/{held_replica}/undrain", headers=auth)
        seen = {client.post(CHAT, json=_body()).headers["x-gateway-replica"] for _ in range(4)}
        assert held_replica in seen
        assert client.post("/admin/replicas/10.9.9.9:1/drain", headers=auth).status_code == 404
        assert client.get("/admin/config", headers=auth).json()["pools"][0]["model"] == MODEL


def test_drain_refuses_new_requests_lets_streams_finish_then_ends_the_rest(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL, token_delay_ms=10)
    raw = gateway_settings([pool([engine])])
    raw["server"]["drain_timeout_s"] = 1.0
    gateway = gateways(raw)
    app = gateway.app
    with (
        httpx.Client(base_url=gateway.url, timeout=10) as client,
        client.stream("POST", CHAT, json=_body(stream=True, max_tokens=30)) as short,
        client.stream("POST", CHAT, json=_body(stream=True, max_tokens=5000)) as long,
    ):
        assert short.status_code == 200 and long.status_code == 200
        drain = threading.Thread(target=lambda: gateway.call(app.drain()))
        drain.start()
        wait_for(lambda: app.draining, what="the gateway started draining")
        refused = client.post(CHAT, json=_body())
        assert refused.status_code == 503 and refused.headers["x-gateway-reject-reason"] == "draining"
        assert int(refused.headers["retry-after"]) >= 1
        assert client.get("/readyz").status_code == 503
        short_lines = [line for line in short.iter_lines() if line]
        assert short_lines[-1] == "data: [DONE]"
        long_lines = [line for line in long.iter_lines() if line]
        assert '"code":"draining"' in long_lines[-1], long_lines[-1]
        drain.join(10)
    assert app.state.registry.total_inflight() == 0


def test_admin_config_shows_no_credential(monkeypatch, mock_engines, gateways) -> None:
    """The Redis URL's password and the tracing headers' values are redacted in `GET /admin/config`."""
    monkeypatch.setenv("LLM_GATEWAY_ADMIN_KEY", ADMIN_KEY)
    secret = "hunter2-s3cret"
    engine = mock_engines(model=MODEL)
    state = {"backend": "redis", "url": f"redis://:{secret}@127.0.0.1:{free_port()}/0"}
    tracing = {"headers": {"authorization": f"Bearer {secret}"}}
    gateway = gateways(gateway_settings([pool([engine])], state=state, tracing=tracing))
    answer = httpx.get(gateway.url + "/admin/config", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert answer.status_code == 200 and secret not in answer.text
    config = answer.json()
    assert config["state"]["url"] == state["url"].replace(secret, "***")
    assert config["tracing"]["headers"] == {"authorization": "***"}
    assert config["pools"][0]["model"] == MODEL
