"""Tenant isolation of stored state, shared by the memory (tests/integration) and Redis (tests/redis)
tests: two tenants, alice and bob, on one pool; everything keyed by a client-visible id — stored
Responses (retrieve, chain, delete, cancel, input items) and Idempotency-Key records — answers another
tenant exactly as an unknown id (404 `response_not_found`, same message, nothing sent to an engine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from admission.tenants import hash_api_key

ALICE_KEY = "sk-alice"
BOB_KEY = "sk-bob"
TENANTS = [
    {"name": "alice", "api_key_hashes": [hash_api_key(ALICE_KEY)]},
    {"name": "bob", "api_key_hashes": [hash_api_key(BOB_KEY)]},
]
REASON = "x-gateway-reject-reason"
REPLICA = "x-gateway-replica"

Call = Callable[[openai.OpenAI, str, str], Any]
"""One stored-state route: (client, model, response id) → the answer (raises on an error status)."""
ROUTES: dict[str, Call] = {
    "retrieve": lambda client, model, rid: client.responses.retrieve(rid),
    "chain": lambda client, model, rid: client.responses.create(
        model=model, input="and then?", previous_response_id=rid, max_output_tokens=3
    ),
    "input_items": lambda client, model, rid: client.responses.input_items.list(rid),
    "cancel": lambda client, model, rid: client.responses.cancel(rid),
    "delete": lambda client, model, rid: client.responses.delete(rid),
}


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=10)


def not_found(call: Callable[[], Any]) -> tuple[str, httpx.Headers]:
    """The message and headers of `call`'s 404."""
    with pytest.raises(openai.NotFoundError) as raised:
        call()
    return raised.value.message, raised.value.response.headers


def assert_route_isolated(route: str, model: str, alice_url: str, bob_url: str) -> None:
    """Alice stores a response through `alice_url`; bob's `route` call on it through `bob_url` is the
    gateway's own 404, word for word the answer for an id that never existed; alice's own call after
    it still reaches her replica (bob's delete deleted nothing)."""
    alice, bob = client(alice_url, ALICE_KEY), client(bob_url, BOB_KEY)
    created = alice.responses.with_raw_response.create(
        model=model, input="alice's secret", max_output_tokens=3
    )
    response_id, replica = created.parse().id, created.headers[REPLICA]
    unknown_id = "resp_" + "0" * 32
    unknown_message, _ = not_found(lambda: ROUTES[route](bob, model, unknown_id))
    message, headers = not_found(lambda: ROUTES[route](bob, model, response_id))
    assert headers[REASON] == "response_not_found" and REPLICA not in headers, "nothing sent upstream"
    assert message.replace(response_id, unknown_id) == unknown_message, "no hint that the id exists"
    if route != "delete":
        kept = alice.responses.with_raw_response.retrieve(response_id)
        assert kept.headers[REPLICA] == replica, "alice's response is where she left it"
    if route == "cancel":  # the holder's own answer: it has the response (a synchronous one)
        with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
            ROUTES[route](alice, model, response_id)
    else:
        ROUTES[route](alice, model, response_id)  # bob's delete deleted nothing: alice's succeeds


def assert_idempotency_isolated(model: str, alice_url: str, bob_url: str, started: Callable[[], int]) -> None:
    """The same Idempotency-Key from two tenants names two records: bob, sending another body under
    alice's key, gets his own generation (not a 400 that tells him the key is taken), and his duplicate
    replays his answer, never alice's; a tenant's duplicate is replayed whichever header (`x-api-key`
    or `Authorization`) carries its key. `started()`: the engines' generations so far."""
    body = {"model": model, "messages": [{"role": "user", "content": "charge the card"}], "max_tokens": 3}
    before = started()

    def post(url: str, key: str, header: str, sent: dict[str, Any]) -> httpx.Response:
        value = f"Bearer {key}" if header == "authorization" else key
        headers = {header: value, "idempotency-key": "order-1"}
        answer = httpx.post(url + "/v1/chat/completions", json=sent, headers=headers, timeout=10)
        assert answer.status_code == 200, answer.text
        return answer

    alice_first = post(alice_url, ALICE_KEY, "x-api-key", body)
    bob_first = post(bob_url, BOB_KEY, "x-api-key", {**body, "max_tokens": 4})
    assert "x-gateway-idempotent-replay" not in bob_first.headers
    bob_again = post(bob_url, BOB_KEY, "authorization", {**body, "max_tokens": 4})
    assert bob_again.headers.get("x-gateway-idempotent-replay") == "true"
    assert bob_again.json()["id"] == bob_first.json()["id"] != alice_first.json()["id"]
    alice_again = post(alice_url, ALICE_KEY, "authorization", body)
    assert alice_again.headers.get("x-gateway-idempotent-replay") == "true"
    assert alice_again.json()["id"] == alice_first.json()["id"]
    assert started() - before == 2, "one generation per tenant"
