"""GET/POST/DELETE /mock/faults: partial updates, the current settings, and clear 400 errors."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from mock_engine.faults import FaultSettings
from mock_engine.fixed_delay import FixedDelayCore
from mock_engine.server import MockEngineApp, MockEngineConfig
from tests.servers import ServerThread

from .conftest import TIMEOUT

Engine = Callable[..., ServerThread]
pytestmark = pytest.mark.timeout(30)


def test_get_returns_the_current_settings(engine: Engine) -> None:
    server = engine(FaultSettings(jitter_ms=3, stall_after_tokens=7))
    response = httpx.get(server.url + "/mock/faults", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.json() == FaultSettings(jitter_ms=3, stall_after_tokens=7).as_dict()


def test_post_is_a_partial_update_and_answers_the_new_settings(engine: Engine) -> None:
    server = engine(FaultSettings(jitter_ms=3))
    url = server.url + "/mock/faults"
    answer = httpx.post(url, json={"error_rate": 0.25, "error_status": 429}, timeout=TIMEOUT)
    assert answer.status_code == 200
    expected = FaultSettings(jitter_ms=3, error_rate=0.25, error_status=429).as_dict()
    assert answer.json() == expected
    assert httpx.get(url, timeout=TIMEOUT).json() == expected
    assert httpx.post(url, json={}, timeout=TIMEOUT).json() == expected


def test_delete_clears_every_fault(engine: Engine) -> None:
    server = engine(FaultSettings(error_rate=1.0, crash_after_tokens=2))
    response = httpx.delete(server.url + "/mock/faults", timeout=TIMEOUT)
    assert response.status_code == 200 and response.json() == FaultSettings().as_dict()


@pytest.mark.parametrize(
    ("content", "param", "words"),
    [
        (b"{not json", None, "invalid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (b'"error_rate"', None, "JSON object"),
        (b'{"error_rate": 2}', "error_rate", "error_rate must be within [0, 1], got 2.0"),
        (b'{"error_rate": "high"}', "error_rate", "error_rate must be a number"),
        (b'{"error_status": 204}', "error_status", "400-599"),
        (b'{"stall_after_tokens": 2.5}', "stall_after_tokens", "must be an integer"),
        (b'{"crash_after_tokens": -3}', "crash_after_tokens", ">= 0"),
        (b'{"jitter_ms": null}', "jitter_ms", "cannot be null"),
        (b'{"refuse_connections": "yes"}', "refuse_connections", "true or false"),
        (b'{"poison_effect": "boom"}', "poison_effect", "poison_effect must be one of stall, error, crash"),
        (b'{"poison_marker": ""}', "poison_marker", "non-empty string"),
        (b'{"poison_marker": ["x"]}', "poison_marker", "must be a string"),
        (b'{"slow_first_token_ms": 5, "typo": 1}', "typo", "unknown fault field(s): typo; known: error_rate"),
    ],
)
def test_invalid_changes_are_400_with_a_clear_message_and_change_nothing(
    engine: Engine, content: bytes, param: str | None, words: str
) -> None:
    server = engine(FaultSettings(jitter_ms=1))
    url = server.url + "/mock/faults"
    response = httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=TIMEOUT)
    assert response.status_code == 400
    error = response.json()["error"]
    assert words in error["message"]
    assert error.get("param") == param and error["type"] == "invalid_fault_settings" and error["code"] == 400
    assert httpx.get(url, timeout=TIMEOUT).json() == FaultSettings(jitter_ms=1).as_dict()


async def test_refusal_needs_a_uvicorn_server() -> None:
    app = MockEngineApp(MockEngineConfig(), FixedDelayCore(), FaultSettings())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://mock") as client:
        response = await client.post("/mock/faults", json={"refuse_connections": True})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "refuse_connections"
        assert "uvicorn" in response.json()["error"]["message"]
        other = await client.post("/mock/faults", json={"error_rate": 0.5})
        assert other.status_code == 200 and other.json()["refuse_connections"] is False


def test_set_faults_threadsafe_needs_a_running_engine() -> None:
    app = MockEngineApp(MockEngineConfig(), FixedDelayCore(), FaultSettings())
    with pytest.raises(RuntimeError, match="not running"):
        app.set_faults_threadsafe({"error_rate": 1.0})


def test_set_faults_threadsafe_validates(engine: Engine) -> None:
    server = engine()
    assert server.app.set_faults_threadsafe({"jitter_ms": 2}).jitter_ms == 2.0
    with pytest.raises(ValueError, match="jitter_ms"):
        server.app.set_faults_threadsafe({"jitter_ms": -2})
