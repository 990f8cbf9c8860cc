"""The error contract on the Anthropic Messages and Responses surfaces: the same reasons, statuses and
headers as every endpoint (docs/API.md, "Error contract"), with Anthropic's body shape on `/v1/messages`, and
each surface's own terminal event after a stream started."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.contract.conftest import (
    CHAT,
    DEAD,
    FREE_KEY,
    MODEL,
    STALL,
    ContractGateway,
    assert_error,
    retry_after_s,
)
from tests.servers import ServerThread

MESSAGES = "/v1/messages"
MODELS = "/v1/models"
RESPONSES = "/v1/responses"


def messages(model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], **extra}


def assert_anthropic_error(
    response: httpx.Response, status: int, reason: str, kind: str, *, retry_after: bool
) -> str:
    """Status and reason header as everywhere; the body `{"type": "error", "error": {"type", "message"}}`."""
    assert response.status_code == status, response.text
    assert response.headers["x-gateway-reject-reason"] == reason
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert body["error"]["message"]
    if retry_after:
        retry_after_s(response)
    else:
        assert "retry-after" not in response.headers
    message: str = body["error"]["message"]
    return message


def test_messages_errors_before_the_start_are_anthropic_shaped(contract_gateway: ContractGateway) -> None:
    with httpx.Client(base_url=contract_gateway.url, timeout=10) as client:
        unknown = client.post(MESSAGES, json=messages("nope"))
        broken = client.post(MESSAGES, content=b"{not json", headers={"content-type": "application/json"})
        no_messages = client.post("/v1/messages/count_tokens", json={"model": MODEL})
        wrong_method = client.get(MESSAGES)
    assert "nope" in assert_anthropic_error(
        unknown, 404, "model_not_found", "not_found_error", retry_after=False
    )
    assert_anthropic_error(broken, 400, "bad_request", "invalid_request_error", retry_after=False)
    assert_anthropic_error(no_messages, 400, "bad_request", "invalid_request_error", retry_after=False)
    assert_anthropic_error(
        wrong_method, 405, "method_not_allowed", "invalid_request_error", retry_after=False
    )
    assert wrong_method.headers["allow"] == "POST"


def test_messages_no_replica_is_an_overloaded_error_with_retry_after(
    contract_gateway: ContractGateway,
) -> None:
    with httpx.Client(base_url=contract_gateway.url, timeout=10) as client:
        answers = [client.post(MESSAGES, json=messages(DEAD)) for _ in range(3)]
    last = answers[-1]  # the first tries find closed ports (502), then nothing is eligible
    assert_anthropic_error(last, 503, "no_replica", "overloaded_error", retry_after=True)


def test_messages_unauthorized_with_x_api_key(tenant_gateway: ServerThread) -> None:
    with httpx.Client(base_url=tenant_gateway.url, timeout=10) as client:
        wrong = client.post(MESSAGES, json=messages(), headers={"x-api-key": "nope"})
        right = client.post(MESSAGES, json=messages(), headers={"x-api-key": FREE_KEY})
    assert_anthropic_error(wrong, 401, "unauthorized", "authentication_error", retry_after=False)
    assert right.status_code == 200 and right.json()["type"] == "message"


@pytest.mark.parametrize("path", [MODELS, MESSAGES, CHAT])
def test_x_api_key_is_a_tenant_key_wherever_one_is_read(tenant_gateway: ServerThread, path: str) -> None:
    """`x-api-key` is accepted as the tenant key on `GET /v1/models` as on the inference routes, and a
    wrong one is refused there too."""
    with httpx.Client(base_url=tenant_gateway.url, timeout=10) as client:
        method, body = ("GET", None) if path == MODELS else ("POST", messages())
        right = client.request(method, path, json=body, headers={"x-api-key": FREE_KEY})
        wrong = client.request(method, path, json=body, headers={"x-api-key": "nope"})
    assert right.status_code == 200, right.text
    assert wrong.status_code == 401 and wrong.headers["x-gateway-reject-reason"] == "unauthorized"


def test_responses_errors_are_openai_shaped(contract_gateway: ContractGateway) -> None:
    with httpx.Client(base_url=contract_gateway.url, timeout=10) as client:
        unknown = client.get(RESPONSES + "/resp_unknown")
        chained = client.post(
            RESPONSES, json={"model": MODEL, "input": "x", "previous_response_id": "resp_x"}
        )
        empty_previous = client.post(
            RESPONSES, json={"model": MODEL, "input": "x", "previous_response_id": ""}
        )
        cancel_unknown = client.post(RESPONSES + "/resp_unknown/cancel")
        wrong_method = client.put(RESPONSES + "/resp_unknown")
        wrong_cancel = client.get(RESPONSES + "/resp_unknown/cancel")
    for answer in (unknown, chained, cancel_unknown):
        assert "resp_" in assert_error(answer, 404, "response_not_found", retry_after=False)["message"]
    assert_error(empty_previous, 400, "bad_request", retry_after=False)
    assert_error(wrong_method, 405, "method_not_allowed", retry_after=False)
    assert wrong_method.headers["allow"] == "GET, DELETE"
    assert_error(wrong_cancel, 405, "method_not_allowed", retry_after=False)
    assert wrong_cancel.headers["allow"] == "POST"


def _events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event."""
    out = []
    for block in response.read().split(b"\n\n"):
        lines = block.decode().splitlines()
        name = next((line[7:] for line in lines if line.startswith("event: ")), "")
        data = next((line[6:] for line in lines if line.startswith("data: ")), None)
        if data is not None:
            out.append((name, orjson.loads(data)))
    return out


@pytest.mark.parametrize(
    ("path", "body", "first_content"),
    [
        (MESSAGES, messages(STALL, stream=True, max_tokens=50), "content_block_delta"),
        (
            RESPONSES,
            {"model": STALL, "input": "x", "stream": True, "max_output_tokens": 50},
            "response.output_text.delta",
        ),
    ],
)
def test_an_error_after_the_stream_started_is_the_surfaces_terminal_error_event(
    contract_gateway: ContractGateway, path: str, body: dict[str, Any], first_content: str
) -> None:
    """The stall pool's engine goes silent after 2 tokens: the idle timeout ends the stream with one
    final `event: error` in the surface's format; no end event pretends it completed."""
    with (
        httpx.Client(timeout=5) as client,
        client.stream("POST", contract_gateway.url + path, json=body) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    names = [name for name, _ in events]
    assert first_content in names, "content was streamed before the error"
    assert names[-1] == "error" and names.count("error") == 1
    assert not {"message_stop", "response.completed", "response.incomplete"} & set(names)
    error = events[-1][1]
    assert error["type"] == "error"
    if path == MESSAGES:
        assert error["error"]["type"] == "timeout_error" and error["error"]["message"]
    else:
        assert error["code"] == "upstream_idle_timeout" and error["message"] and error["param"] is None
