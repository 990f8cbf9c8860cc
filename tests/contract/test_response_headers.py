"""Response headers (DESIGN §4): `x-request-id` (echoed, or generated when absent), `x-gateway-pool`,
`x-gateway-replica`,
`x-gateway-route` (policy and branch), `x-gateway-queue-ms`, and `Server-Timing` with `queue` and
`upstream-ttft`, on streamed and non-streamed answers; the request id on error answers too."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.contract.conftest import CHAT, MODEL, ContractGateway, chat, replica_id

ROUTE = re.compile(r"policy=least-load; branch=[a-z_]+(; .+)?")
TIMING = re.compile(r"queue;dur=(\d+(?:\.\d+)?), upstream-ttft;dur=(\d+(?:\.\d+)?)")


def _send(gateway: ContractGateway, stream: bool, headers: dict[str, str]) -> httpx.Response:
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", gateway.url + CHAT, json=chat(stream=stream), headers=headers) as response,
    ):
        body = response.read()
    assert response.status_code == 200, body
    return response


@pytest.mark.parametrize("stream", [False, True])
def test_a_served_request_carries_the_gateway_headers(
    contract_gateway: ContractGateway, stream: bool
) -> None:
    echoed = _send(contract_gateway, stream, {"x-request-id": "contract-abc-123"})
    assert echoed.headers["x-request-id"] == "contract-abc-123"
    generated = [_send(contract_gateway, stream, {}).headers["x-request-id"] for _ in range(2)]
    assert all(generated) and generated[0] != generated[1], "a fresh id per request when none was sent"

    replicas = {replica_id(engine.url) for engine in contract_gateway.engines[MODEL]}
    assert echoed.headers["x-gateway-replica"] in replicas
    assert echoed.headers["x-gateway-pool"] == MODEL
    assert ROUTE.fullmatch(echoed.headers["x-gateway-route"]), echoed.headers["x-gateway-route"]
    queue_ms = echoed.headers["x-gateway-queue-ms"]
    assert queue_ms.isdigit(), "whole milliseconds"
    timing = TIMING.fullmatch(echoed.headers["server-timing"])
    assert timing, echoed.headers["server-timing"]
    assert abs(float(timing[1]) - int(queue_ms)) <= 1.0, "Server-Timing's queue is x-gateway-queue-ms"
    assert float(timing[2]) > 0, "the first token took some time"


ERRORS = {
    "bad_request": ("POST", CHAT, b"{not json"),
    "model_not_found": ("POST", CHAT, b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}'),
    "not_found": ("GET", "/v1/nothing", b""),
    "method_not_allowed": ("GET", CHAT, b""),
}


@pytest.mark.parametrize(
    "reason",
    [
        "bad_request",
        "model_not_found",
        "not_found",
        "method_not_allowed",
    ],
)
def test_an_error_answer_echoes_the_request_id(contract_gateway: ContractGateway, reason: str) -> None:
    method, path, body = ERRORS[reason]
    response = httpx.request(
        method, contract_gateway.url + path, content=body, headers={"x-request-id": "contract-err-7"}
    )
    assert response.headers["x-gateway-reject-reason"] == reason
    assert response.headers.get("x-request-id") == "contract-err-7"


@pytest.mark.parametrize(
    "path", ["/healthz", "/health", "/readyz", "/v1/models", "/openapi.json", "/metrics"]
)
def test_head_on_a_get_route_is_the_get_without_its_body(
    contract_gateway: ContractGateway, path: str
) -> None:
    """Same status and headers as GET (`content-length` included: the length GET's body has), no body."""
    get = httpx.get(contract_gateway.url + path)
    head = httpx.head(contract_gateway.url + path)
    assert (head.status_code, head.content) == (get.status_code, b"")
    assert int(head.headers["content-length"]) > 0
    if path != "/metrics":  # its text changes from one scrape to the next
        unstable = {"date", "x-request-id"}
        assert {k: v for k, v in head.headers.items() if k not in unstable} == {
            k: v for k, v in get.headers.items() if k not in unstable
        }


def test_head_on_a_post_route_is_a_405_naming_post(contract_gateway: ContractGateway) -> None:
    head = httpx.head(contract_gateway.url + CHAT)
    assert head.status_code == 405 and head.headers["allow"] == "POST" and head.content == b""
    assert head.headers["x-gateway-reject-reason"] == "method_not_allowed"
