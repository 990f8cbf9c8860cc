"""End to end with the official `anthropic` client through a real gateway in front of real mock engines:
the Messages API passes through with the gateway's routing, admission, timers and accounting, and the
gateway's own errors come back in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

from mock_engine.faults import FaultSettings
from tests.contract.conftest import key_hash
from tests.integration.conftest import MODEL, Fleet, pool
from tests.servers import ServerThread, gateway_settings, wait_until

HELLO = [{"role": "user", "content": "hello there"}]


def _client(url: str, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0, timeout=10)


def test_messages_non_streamed(fleet: Fleet) -> None:
    message = _client(fleet.gateway.url).messages.create(model=MODEL, max_tokens=5, messages=HELLO)
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "max_tokens"
    assert len(message.content[0].text.split()) == 5
    assert message.usage.output_tokens == 5 and message.usage.input_tokens == 3
    chat = openai.OpenAI(base_url=fleet.gateway.url + "/v1", api_key="unused", max_retries=0)
    same = chat.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5)  # type: ignore[arg-type]
    assert message.content[0].text == same.choices[0].message.content, "the same generation as chat"


def test_messages_streamed_accounts_usage_from_its_events(fleet: Fleet) -> None:
    metrics = fleet.app.state.metrics
    output, prompt = metrics.tokens_total.labels("output"), metrics.tokens_total.labels("input")
    before_output, before_prompt = output._value.get(), prompt._value.get()
    ttft = metrics.ttft_seconds.collect()[0]
    with _client(fleet.gateway.url).messages.stream(model=MODEL, max_tokens=4, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text.split()) == 4 and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 4
    # usage from message_start (input) and message_delta (output), accounted in the handler's `finally`
    assert wait_until(lambda: output._value.get() - before_output == 4), "output tokens accounted"
    assert prompt._value.get() - before_prompt == 3
    assert sum(s.value for s in metrics.ttft_seconds.collect()[0].samples if s.name.endswith("_count")) > sum(
        s.value for s in ttft.samples if s.name.endswith("_count")
    ), "a TTFT was observed"
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}), "in-flight back to zero"


def test_count_tokens(fleet: Fleet) -> None:
    counted = _client(fleet.gateway.url).messages.count_tokens(model=MODEL, messages=HELLO)
    assert counted.input_tokens == 3


def test_gateway_errors_are_anthropic_shaped(fleet: Fleet) -> None:
    with pytest.raises(anthropic.NotFoundError) as raised:
        _client(fleet.gateway.url).messages.create(model="no-such-model", max_tokens=5, messages=HELLO)
    error = raised.value
    assert error.status_code == 404
    assert error.response.headers["x-gateway-reject-reason"] == "model_not_found"
    body = error.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "no-such-model" in body["error"]["message"]


def test_an_engine_error_passes_through(fleet: Fleet) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:  # the engine wants max_tokens >= 1
        _client(fleet.gateway.url).messages.create(model=MODEL, max_tokens=0, messages=HELLO)
    assert raised.value.response.headers["x-gateway-reject-reason"] == "upstream_status"
    assert raised.value.response.json()["error"]["type"] == "invalid_request_error"


@pytest.fixture
def tenant_fleet(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> ServerThread:
    engine = mock_engines(model=MODEL)
    tenants = [{"name": "team", "api_key_hashes": [key_hash("sk-team")]}]
    return gateways(gateway_settings([pool([engine])], tenants=tenants))


def test_x_api_key_is_the_tenant_key(tenant_fleet: ServerThread) -> None:
    message = _client(tenant_fleet.url, api_key="sk-team").messages.create(
        model=MODEL, max_tokens=2, messages=HELLO
    )
    assert message.usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError) as raised:
        _client(tenant_fleet.url, api_key="sk-wrong").messages.create(
            model=MODEL, max_tokens=2, messages=HELLO
        )
    assert raised.value.response.headers["x-gateway-reject-reason"] == "unauthorized"
    assert raised.value.response.json()["error"]["type"] == "authentication_error"


@pytest.fixture
def slow_fleet(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> ServerThread:
    """Engines whose first token is 2 s late, behind a first-token deadline of 0.3 s (one try)."""
    engine = mock_engines(model=MODEL, faults=FaultSettings(slow_first_token_ms=2000))
    settings = pool([engine], timeouts={"ttft_s": 0.3}, retries={"max_attempts": 1})
    return gateways(gateway_settings([settings]))


def test_ttft_is_the_first_content_block_delta_not_message_start(slow_fleet: ServerThread) -> None:
    """The mock sends `message_start` at once and the first `content_block_delta` 2 s later: the
    first-token deadline fires, before any byte reached the client, as an Anthropic-shaped 504."""
    with (
        pytest.raises(anthropic.APIStatusError) as raised,
        _client(slow_fleet.url).messages.stream(model=MODEL, max_tokens=3, messages=HELLO) as stream,
    ):
        stream.until_done()
    assert raised.value.status_code == 504
    assert raised.value.response.headers["x-gateway-reject-reason"] == "upstream_ttft_timeout"
    assert raised.value.response.json()["error"]["type"] == "timeout_error"
