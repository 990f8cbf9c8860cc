"""Credentials (issue 19, items 7 and 8): a tenant's key never reaches the engines; the pool's own engine
key does; `/v1/models` authenticates like the inference routes."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from gateway.config.settings import parse_settings
from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.integration.conftest import MODEL, pool
from tests.servers import ServerThread, gateway_settings, start_gateway

TENANT_KEY = "tenant-secret-1"
CHAT = "/v1/chat/completions"


class RecordingEngine:
    """A mock engine that remembers the headers of every HTTP request it receives."""

    def __init__(self, inner: MockEngineApp) -> None:
        self.inner = inner
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            self.headers.append(dict(scope["headers"]))
        await self.inner(scope, receive, send)


@pytest.fixture
def recording_engine():
    inner = MockEngineApp(MockEngineConfig(model=MODEL), FixedDelayCore(0.005, 0.001), FaultSettings())
    recorder = RecordingEngine(inner)
    server = ServerThread(recorder, "recording-engine").start()
    yield recorder, server
    server.stop()


def _tenants() -> list[dict[str, Any]]:
    return [{"name": "acme", "api_key_hashes": [hashlib.sha256(TENANT_KEY.encode()).hexdigest()]}]


def test_the_tenant_key_never_reaches_the_engine_and_the_engine_key_does(
    monkeypatch, recording_engine
) -> None:
    recorder, server = recording_engine
    monkeypatch.setenv("TEST_ENGINE_KEY", "engine-secret-9")
    settings = gateway_settings([pool([server], engine_api_key_env="TEST_ENGINE_KEY")], tenants=_tenants())
    gateway = start_gateway(settings)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(gateway.url + CHAT, json=body, headers={"authorization": f"Bearer {TENANT_KEY}"})
        assert answer.status_code == 200
    finally:
        gateway.stop()
    seen = recorder.headers[-1]
    assert seen[b"authorization"] == b"Bearer engine-secret-9"
    assert all(TENANT_KEY.encode() not in value for headers in recorder.headers for value in headers.values())


def test_without_an_engine_key_no_authorization_goes_upstream(recording_engine, gateways) -> None:
    recorder, server = recording_engine
    gateway = gateways(gateway_settings([pool([server])]))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert (
        httpx.post(gateway.url + CHAT, json=body, headers={"authorization": "Bearer client-key"}).status_code
        == 200
    )
    assert b"authorization" not in recorder.headers[-1]


@pytest.mark.parametrize(
    ("path", "body", "forwarded"),
    [
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, True),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}, True),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, False),
    ],
)
def test_the_anthropic_headers_reach_an_engine_that_speaks_messages_and_the_key_does_not(
    recording_engine, gateways, path: str, body: dict[str, Any], forwarded: bool
) -> None:
    """`anthropic-version` and `anthropic-beta` go upstream on the Messages endpoints (only there: no
    other engine API reads them); the client's `x-api-key` never does."""
    recorder, server = recording_engine
    gateway = gateways(gateway_settings([pool([server])], tenants=_tenants()))
    headers = {
        "x-api-key": TENANT_KEY,
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "prompt-caching-2024-07-31",
    }
    answer = httpx.post(gateway.url + path, json={"model": MODEL, **body}, headers=headers)
    assert answer.status_code == 200, answer.text
    seen = recorder.headers[-1]
    expected = {b"2023-06-01", b"prompt-caching-2024-07-31"} if forwarded else {None}
    assert {seen.get(b"anthropic-version"), seen.get(b"anthropic-beta")} == expected
    assert b"x-api-key" not in seen
    assert all(TENANT_KEY.encode() not in value for value in seen.values())


def test_a_missing_engine_key_variable_fails_the_start(monkeypatch, mock_engines) -> None:
    from gateway.composition import Components
    from gateway.config.settings import ConfigError

    monkeypatch.delenv("TEST_ENGINE_KEY_UNSET", raising=False)
    engine = mock_engines(model=MODEL)
    settings = parse_settings(gateway_settings([pool([engine], engine_api_key_env="TEST_ENGINE_KEY_UNSET")]))
    import asyncio

    async def start() -> None:
        components = Components(settings)
        try:
            await components.start()
        finally:
            await components.aclose()

    with pytest.raises(
        ConfigError, match=r"pools\.0\.engine_api_key_env: environment variable TEST_ENGINE_KEY_UNSET"
    ):
        asyncio.run(start())


def test_models_needs_the_same_key_as_the_inference_routes(mock_engines, gateways) -> None:
    engine = mock_engines(model=MODEL)
    gateway = gateways(gateway_settings([pool([engine])], tenants=_tenants()))
    denied = httpx.get(gateway.url + "/v1/models", headers={"authorization": "Bearer wrong"})
    assert denied.status_code == 401 and denied.headers["x-gateway-reject-reason"] == "unauthorized"
    assert httpx.get(gateway.url + "/v1/models").status_code == 401
    allowed = httpx.get(gateway.url + "/v1/models", headers={"authorization": f"Bearer {TENANT_KEY}"})
    assert allowed.status_code == 200 and [m["id"] for m in allowed.json()["data"]] == [MODEL]
