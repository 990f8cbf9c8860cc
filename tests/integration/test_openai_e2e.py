"""End to end with the official `openai` client through a real gateway in front of real mock engines."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.conftest import MODEL, Fleet
from tests.servers import wait_until


def _client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def _async_client(fleet: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fleet.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def test_chat_non_streaming(fleet: Fleet) -> None:
    result = _client(fleet).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=5
    )
    assert result.choices[0].finish_reason == "length"
    assert len(result.choices[0].message.content.split()) == 5
    assert result.usage is not None and result.usage.completion_tokens == 5
    assert result.usage.prompt_tokens == 3  # ceil(len("hello there") / 4)


def test_chat_streaming_strips_usage_the_client_did_not_ask_for(fleet: Fleet) -> None:
    stream = _client(fleet).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 4
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks), "the usage-only chunk must not reach a client that did not ask"
    output_tokens = fleet.app.state.metrics.tokens_total.labels("output")
    # accounted in the handler's `finally`, just after the last byte reached the client
    assert wait_until(lambda: output_tokens._value.get() == 4), "the gateway accounts the usage it asked for"


def test_chat_streaming_keeps_usage_when_asked(fleet: Fleet) -> None:
    stream = _client(fleet).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_completions_streaming_and_not(fleet: Fleet) -> None:
    client = _client(fleet)
    full = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=6)
    assert len(full.choices[0].text.split()) == 6
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=6, stream=True)
        if c.choices
    )
    assert streamed == full.choices[0].text, "deterministic engine: same prompt, same text"


def test_an_integral_json_number_is_accepted_as_the_engine_accepts_it(fleet: Fleet) -> None:
    """`max_tokens: 4.0` and `1e1` are integers to vLLM, pydantic and the mock: the gateway serves them
    (the body as the client wrote it); a value past 2^63 is the gateway's own clear 400."""
    url = fleet.gateway.url + "/v1/chat/completions"
    for literal, tokens in (("4.0", 4), ("1e1", 10)):
        body = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": %s}'
        answer = httpx.post(
            url, content=body % (MODEL, literal), headers={"content-type": "application/json"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == tokens
    huge = httpx.post(
        url, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2**63}
    )
    assert huge.status_code == 400 and huge.headers["x-gateway-reject-reason"] == "bad_request"
    assert "'max_tokens' must be at most 9223372036854775807" in huge.json()["error"]["message"]


def test_embeddings(fleet: Fleet) -> None:
    result = _client(fleet).embeddings.create(model=MODEL, input=["a", "bb"])
    assert [d.index for d in result.data] == [0, 1]
    assert len(result.data[0].embedding) == 8


def test_models_list(fleet: Fleet) -> None:
    models = _client(fleet).models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_async_client_chat_streaming_and_not(fleet: Fleet) -> None:
    client = _async_client(fleet)
    result = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "async"}], max_tokens=3
    )
    assert result.usage is not None and result.usage.completion_tokens == 3
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "async"}], max_tokens=3, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == result.choices[0].message.content
    await client.close()


def test_unknown_model_is_a_404_the_sdk_understands(fleet: Fleet) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        _client(fleet).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.response.headers["x-gateway-reject-reason"] == "model_not_found"
    assert info.value.body["code"] == "model_not_found"


def test_response_headers_explain_the_route(fleet: Fleet) -> None:
    raw = _client(fleet).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=1,
        extra_headers={"x-request-id": "abc-123"},
    )
    assert raw.headers["x-request-id"] == "abc-123"
    assert raw.headers["x-gateway-replica"] in {e.url.removeprefix("http://") for e in fleet.engines}
    assert raw.headers["x-gateway-route"].startswith("policy=least-load; branch=")
    assert "upstream-ttft;dur=" in raw.headers["server-timing"]


def test_goodput_counts_requests_within_the_slo(mock_engines, gateways) -> None:
    from tests.integration.conftest import pool
    from tests.servers import gateway_settings

    engine = mock_engines(model=MODEL, token_delay_ms=20)
    fast = gateways(gateway_settings([pool([engine], slo={"ttft_s": 2.0, "tpot_s": 0.5})]))
    slow = gateways(gateway_settings([pool([engine], slo={"ttft_s": 2.0, "tpot_s": 0.001})]))
    for gateway in (fast, slow):
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
        list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5, stream=True
            )
        )
    for g in (fast, slow):  # accounting happens in the handler's `finally`, after the last byte
        done = g.app.state.metrics.requests_total.labels(MODEL, "success")
        assert wait_until(lambda done=done: done._value.get() == 1)
    good = [g.app.state.metrics.goodput_tokens_total.labels(MODEL)._value.get() for g in (fast, slow)]
    assert good == [5, 0], "20 ms per token meets a 500 ms TPOT SLO, not a 1 ms one"
