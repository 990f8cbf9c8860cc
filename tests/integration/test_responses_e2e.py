"""End to end with the official `openai` client's Responses API through a real gateway in front of three
real mock engines, each with its own in-memory response store that answers 404 for an id it never
stored: a chained conversation, retrieve, delete and cancel only work when the gateway sends them to the
replica that holds the response (state affinity), and a replica gone is a clear 404, never a silent
answer from another."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.upstream.discovery.types import ReplicaSet
from tests.integration.conftest import MODEL, Fleet
from tests.servers import wait_until

REPLICA = "x-gateway-replica"
REASON = "x-gateway-reject-reason"


def _client(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def _create(client: openai.OpenAI, **kwargs: object) -> tuple[str, str, str]:
    """(response id, output text, the replica that served it)."""
    raw = client.responses.with_raw_response.create(model=MODEL, max_output_tokens=4, **kwargs)  # type: ignore[call-overload]
    response = raw.parse()
    return response.id, response.output_text, raw.headers[REPLICA]


def _set_draining(fleet: Fleet, replica_id: str, draining: bool) -> None:
    registry = fleet.app.state.registry
    (replica,) = registry.find(replica_id)

    async def change() -> None:
        registry.set_draining(replica, draining)

    fleet.gateway.call(change())


def _engine_stored(fleet: Fleet) -> list[int]:
    return [httpx.get(e.url + "/mock/stats").json()["responses_stored"] for e in fleet.engines]


def test_create_non_streamed(fleet: Fleet) -> None:
    response = _client(fleet).responses.create(model=MODEL, input="hello there", max_output_tokens=5)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete" and len(response.output_text.split()) == 5
    assert response.usage is not None and response.usage.output_tokens == 5
    output = fleet.app.state.metrics.tokens_total.labels("output")
    assert wait_until(lambda: output._value.get() == 5), "usage accounted from the response object"


def test_chained_conversations_stay_on_the_replica_that_holds_them(fleet: Fleet) -> None:
    """Six conversations of three turns, interleaved: least-load spreads their first turns over the three
    replicas; every later turn goes where its previous response is stored (elsewhere the engine would
    answer 404)."""
    client = _client(fleet)
    chains = [[_create(client, input=f"conversation {i}")] for i in range(6)]
    for _ in range(2):
        for chain in chains:
            previous_id = chain[-1][0]
            chain.append(_create(client, input="and then?", previous_response_id=previous_id))
    for chain in chains:
        assert len({replica for _, _, replica in chain}) == 1, chain
    assert len({chain[0][2] for chain in chains}) > 1, "the first turns were spread over replicas"
    assert sum(_engine_stored(fleet)) == 18
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}), "in-flight back to zero"


def test_retrieve_delete_and_cancel_reach_the_replica_that_holds_the_response(fleet: Fleet) -> None:
    client = _client(fleet)
    ids = [_create(client, input=f"keep {i}") for i in range(3)]
    for response_id, text, replica in ids:
        raw = client.responses.with_raw_response.retrieve(response_id)
        assert raw.headers[REPLICA] == replica and raw.parse().output_text == text
    first_id, _, replica = ids[0]
    with pytest.raises(openai.BadRequestError) as raised:  # the holder's answer; another would say 404
        client.responses.cancel(first_id)
    assert "Cannot cancel a synchronous response" in str(raised.value)
    deleted = client.responses.with_raw_response.delete(first_id)
    assert deleted.headers[REPLICA] == replica and deleted.status_code == 200


def test_a_pinned_request_says_so_in_its_route_and_the_routing_metric(fleet: Fleet) -> None:
    """A chained request and an id call are pinned to the holder: `branch=pinned` in `x-gateway-route`
    (not the policy's own branch, which would describe a choice that was not made), counted under it."""
    client = _client(fleet)
    created = client.responses.with_raw_response.create(model=MODEL, input="first", max_output_tokens=3)
    assert "branch=least_load" in created.headers["x-gateway-route"]
    response_id = created.parse().id
    chained = client.responses.with_raw_response.create(
        model=MODEL, input="then", previous_response_id=response_id, max_output_tokens=3
    )
    retrieved = client.responses.with_raw_response.retrieve(response_id)
    for raw in (chained, retrieved):
        assert raw.headers["x-gateway-route"].startswith("policy=least-load; branch=pinned;")
    pinned = fleet.app.state.metrics.routing_decisions_total.labels("least-load", "pinned")
    assert pinned._value.get() == 2


def test_input_items_are_listed_by_the_replica_that_holds_the_response(fleet: Fleet) -> None:
    client = _client(fleet)
    first_id, _, replica = _create(client, input="first turn")
    second_id, _, _ = _create(client, input="second turn", previous_response_id=first_id)
    raw = client.responses.input_items.with_raw_response.list(second_id)
    assert raw.headers[REPLICA] == replica
    texts = [item.content[0].text for item in raw.parse().data]  # type: ignore[union-attr]
    assert texts[0] == "first turn" and texts[-1] == "second turn"


def test_a_deleted_response_is_forgotten_by_the_gateway(fleet: Fleet) -> None:
    """After a successful delete the gateway itself answers 404 `response_not_found` for the id (no
    replica touched: no `x-gateway-replica`, which a forwarded call would carry), for every call on it
    and as a `previous_response_id`; the other responses keep their affinity."""
    client = _client(fleet)
    (gone_id, _, _), (kept_id, kept_text, kept_replica) = (_create(client, input=f"r {i}") for i in range(2))
    client.responses.delete(gone_id)
    for call in (
        lambda: client.responses.retrieve(gone_id),
        lambda: client.responses.delete(gone_id),
        lambda: client.responses.cancel(gone_id),
        lambda: client.responses.create(model=MODEL, input="x", previous_response_id=gone_id),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        headers = raised.value.response.headers
        assert headers[REASON] == "response_not_found" and REPLICA not in headers
        assert raised.value.code == "response_not_found" and gone_id in raised.value.message
    assert _engine_stored(fleet).count(1) == 1, "only the kept response is stored"
    kept = client.responses.with_raw_response.retrieve(kept_id)
    assert kept.headers[REPLICA] == kept_replica and kept.parse().output_text == kept_text


def test_a_delete_the_engine_refuses_keeps_the_affinity(fleet: Fleet) -> None:
    """The holder lost the response behind the gateway's back (here: deleted on the engine directly, as
    after an engine restart): the gateway's delete is the holder's 404, the gateway keeps the entry, and
    later calls still reach the holder (its 404, passed through), never another replica."""
    client = _client(fleet)
    response_id, _, replica = _create(client, input="lost behind the gateway")
    (engine,) = [e for e in fleet.engines if e.url.endswith(replica.rpartition(":")[2])]
    assert httpx.delete(f"{engine.url}/v1/responses/{response_id}").status_code == 200
    for call in (
        lambda: client.responses.delete(response_id),
        lambda: client.responses.retrieve(response_id),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        headers = raised.value.response.headers
        assert headers[REASON] == "upstream_status" and headers[REPLICA] == replica


def test_streamed_create_is_remembered_from_its_created_event(fleet: Fleet) -> None:
    client = _client(fleet)
    output = fleet.app.state.metrics.tokens_total.labels("output")
    before = output._value.get()
    events = list(client.responses.create(model=MODEL, input="stream it", max_output_tokens=4, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert kinds.count("response.output_text.delta") == 4
    response_id = events[0].response.id  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert wait_until(lambda: output._value.get() - before == 4), "usage from response.incomplete"
    follow_id, _, _ = _create(client, input="more", previous_response_id=response_id)
    assert client.responses.retrieve(response_id).output_text == text
    assert follow_id != response_id


def test_a_response_on_a_drained_replica_is_lost_with_a_clear_404(fleet: Fleet) -> None:
    client = _client(fleet)
    response_id, _, replica = _create(client, input="remember me")
    _set_draining(fleet, replica, True)
    for call in (
        lambda: client.responses.create(model=MODEL, input="next", previous_response_id=response_id),
        lambda: client.responses.retrieve(response_id),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert raised.value.response.headers[REASON] == "response_state_lost"
        assert raised.value.code == "response_state_lost"
        assert replica in raised.value.message and "not routable" in raised.value.message
    _set_draining(fleet, replica, False)
    assert client.responses.retrieve(response_id).id == response_id


def test_a_lost_response_is_answered_before_the_timer_headers_are_read(fleet: Fleet) -> None:
    """The handler's order: the stored response's replica routable (404) before the timer headers
    (400), as for the model and the endpoint."""
    client = _client(fleet)
    response_id, _, replica = _create(client, input="remember me")
    _set_draining(fleet, replica, True)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(
            model=MODEL,
            input="next",
            previous_response_id=response_id,
            extra_headers={"x-gateway-ttft-timeout-ms": "0"},
        )
    assert raised.value.response.headers[REASON] == "response_state_lost"


def test_a_response_on_a_removed_replica_is_lost_with_a_clear_404(fleet: Fleet) -> None:
    client = _client(fleet)
    response_id, _, replica = _create(client, input="remember me")
    registry = fleet.app.state.registry
    pool = registry.pool(MODEL)
    assert pool is not None
    keep = [r.url for r in pool.replicas.values() if r.replica_id != replica]

    async def remove() -> None:
        registry.apply_membership(pool, ReplicaSet.of(ready=keep))

    fleet.gateway.call(remove())
    assert wait_until(lambda: replica not in pool.replicas)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=MODEL, input="next", previous_response_id=response_id)
    assert raised.value.response.headers[REASON] == "response_state_lost"
    assert "has left" in raised.value.message


def test_an_id_the_gateway_never_relayed_is_not_found(fleet: Fleet) -> None:
    client = _client(fleet)
    for call in (
        lambda: client.responses.retrieve("resp_never"),
        lambda: client.responses.create(model=MODEL, input="x", previous_response_id="resp_never"),
    ):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert raised.value.response.headers[REASON] == "response_not_found"
    assert wait_until(lambda: set(fleet.inflight().values()) == {0}), "in-flight back to zero"


def test_an_idempotency_key_is_scoped_to_its_response_id_call(fleet: Fleet) -> None:
    client = _client(fleet)
    first, second = (_create(client, input=f"r {i}")[0] for i in range(2))
    key = {"Idempotency-Key": "same-key"}
    assert client.responses.retrieve(first, extra_headers=key).id == first
    assert client.responses.retrieve(second, extra_headers=key).id == second
    client.responses.delete(second, extra_headers=key)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second)
