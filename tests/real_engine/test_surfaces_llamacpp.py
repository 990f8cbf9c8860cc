"""The Anthropic Messages and OpenAI Responses surfaces (issue 16) through the gateway against the real
llama.cpp replicas, with the official clients: `anthropic` (`messages.create` streamed and not,
`messages.count_tokens`) and `openai` (`responses.create` streamed and not).

This llama.cpp build (xllamacpp 2026.10.11549) serves `/v1/messages`, `/v1/messages/count_tokens` and
`POST /v1/responses`, but keeps no response store: `GET`/`DELETE /v1/responses/{id}` are not routes of
its server (404 "File Not Found") and `previous_response_id` is refused (400 "llama.cpp does not support
'previous_response_id'"). The gateway still pins those calls to the replica that produced the id (state
affinity), so the client gets that replica's own answer, passed through — which the last test proves.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.real_engine.conftest import MODEL, openai_client
from tests.servers import ServerThread, wait_until

pytestmark = pytest.mark.real_engine

REPLICA = "x-gateway-replica"
REASON = "x-gateway-reject-reason"
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"cache_prompt": False}}
"""Greedy decoding, llama.cpp's prompt cache off: the same text whichever replica serves each request."""
ANTHROPIC_GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0, "cache_prompt": False}}
"""The same for the `anthropic` client, whose `messages.create` (2.x) has no `temperature` argument."""
MESSAGES = [{"role": "user", "content": "Name three colours."}]


def _anthropic(gateway: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=90.0)


def _output_tokens(gateway: ServerThread) -> float:
    return float(gateway.app.state.metrics.tokens_total.labels("output")._value.get())


@pytest.mark.timeout(180)
def test_anthropic_messages_streamed_and_not(real_gateway) -> None:
    gateway = real_gateway("least-load")
    client = _anthropic(gateway)
    replicas = {r.replica_id for r in gateway.app.state.registry.all_replicas()}
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, messages=MESSAGES, **ANTHROPIC_GREEDY
    )
    assert raw.headers[REPLICA] in replicas
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in {"max_tokens", "end_turn"}
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip()
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    assert wait_until(lambda: _output_tokens(gateway) == message.usage.output_tokens), "usage accounted"

    events = list(
        client.messages.create(model=MODEL, max_tokens=8, messages=MESSAGES, stream=True, **ANTHROPIC_GREEDY)
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    streamed = "".join(
        e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert streamed == text, "greedy: the same text streamed and not"
    (delta,) = [e for e in events if e.type == "message_delta"]
    total = message.usage.output_tokens + delta.usage.output_tokens
    assert wait_until(lambda: _output_tokens(gateway) == total), "usage from message_start/message_delta"

    counted = client.messages.count_tokens(model=MODEL, messages=MESSAGES)
    assert counted.input_tokens > 0


@pytest.mark.timeout(60)
def test_anthropic_errors_have_anthropic_shape(real_gateway) -> None:
    """The gateway's own refusals on this surface, as the SDK sees them: Anthropic's error body."""
    client = _anthropic(real_gateway("least-load"))
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=4, messages=MESSAGES)
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert unknown.value.response.headers[REASON] == "model_not_found"
    with pytest.raises(anthropic.BadRequestError) as empty:  # llama.cpp itself would accept it
        client.messages.create(model=MODEL, max_tokens=4, messages=[])
    assert empty.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert empty.value.response.headers[REASON] == "bad_request"


@pytest.mark.timeout(180)
def test_openai_responses_streamed_and_not(real_gateway) -> None:
    gateway = real_gateway("least-load")
    client = openai_client(gateway)
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Name three colours.", max_output_tokens=8, **GREEDY
    )
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text.strip()
    assert response.usage is not None and 0 < response.usage.output_tokens <= 8
    assert wait_until(lambda: _output_tokens(gateway) == response.usage.output_tokens), "usage accounted"

    events = list(
        client.responses.create(
            model=MODEL, input="Name three colours.", max_output_tokens=8, stream=True, **GREEDY
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == response.output_text, "greedy: the same text streamed and not"
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == text and completed.usage is not None
    total = response.usage.output_tokens + completed.usage.output_tokens
    assert wait_until(lambda: _output_tokens(gateway) == total), "usage from response.completed"


@pytest.mark.timeout(120)
def test_a_stored_response_call_reaches_the_replica_that_answered(real_gateway) -> None:
    """State affinity against an engine without a store (module docstring): retrieve and
    `previous_response_id` are pinned to the replica that produced the id and get its own refusal
    (`upstream_status`), never another replica's answer; an id the gateway never relayed is its 404."""
    gateway = real_gateway("least-load")
    client = openai_client(gateway)
    raw = client.responses.with_raw_response.create(model=MODEL, input="Say hi.", max_output_tokens=4)
    response_id, replica = raw.parse().id, raw.headers[REPLICA]
    for _ in range(2):  # least-load would spread these over both replicas
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.retrieve(response_id)
        assert gone.value.response.headers[REPLICA] == replica
        assert gone.value.response.headers[REASON] == "upstream_status"
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(
                model=MODEL, input="And then?", max_output_tokens=4, previous_response_id=response_id
            )
        assert refused.value.response.headers[REPLICA] == replica
        assert "previous_response_id" in refused.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.retrieve("resp_never_relayed")
    assert unknown.value.response.headers[REASON] == "response_not_found"
