"""The Redis idempotency store's stored form, its size bound, and the store choice (no Redis needed)."""

from __future__ import annotations

from core.clock import FakeClock
from core.shared_state import RedisBackend, make_redis_client
from core.state_outage import FailureMode
from gateway.base.error_mapping import to_response
from gateway.base.errors import StateUnavailable
from gateway.config.settings import IdempotencySettings
from gateway.proxy.stores.idempotency import IdempotencyCache, StoredResponse
from gateway.proxy.stores.idempotency_redis import (
    RedisIdempotencyStore,
    decode_response,
    encode_response,
    idempotency_store,
)

HEADERS = [(b"content-type", b"application/json"), (b"x-gateway-replica", b"r\xe9plica-1")]


def test_json_bodies_are_stored_as_text_and_round_trip() -> None:
    response = StoredResponse(200, HEADERS, '{"text":"héllo \\"quoted\\" 日本"}'.encode())
    stored = encode_response(response, 1 << 20)
    assert stored is not None and stored[2] == "u"
    assert stored[3] == response.body.decode(), "no escaping or base64 for UTF-8 text"
    assert decode_response(*stored) == response


def test_binary_bodies_round_trip_through_base64() -> None:
    response = StoredResponse(201, [], bytes(range(256)))
    stored = encode_response(response, 1 << 20)
    assert stored is not None and stored[2] == "b"
    assert decode_response(*stored) == response


def test_responses_over_the_size_bound_are_not_stored() -> None:
    body = b"x" * 998  # + 2 bytes of headers (`[]`) = the bound
    assert encode_response(StoredResponse(200, [], body), 1000) is not None
    assert encode_response(StoredResponse(200, [], body + b"x"), 1000) is None
    assert encode_response(StoredResponse(200, HEADERS, body), 1000) is None, "headers count too"


def test_the_state_backend_decides_the_store() -> None:
    assert isinstance(idempotency_store(None, FakeClock(), IdempotencySettings()), IdempotencyCache)
    backend = RedisBackend(make_redis_client("redis://127.0.0.1:1/0"))
    assert isinstance(idempotency_store(backend, FakeClock(), IdempotencySettings()), RedisIdempotencyStore)
    assert backend.on_error is FailureMode.FAIL_OPEN


def test_fail_closed_answers_503_state_unavailable() -> None:
    answer = to_response(StateUnavailable("redis down", retry_after_s=2.5))
    assert answer.status == 503
    assert ("x-gateway-reject-reason", "state_unavailable") in answer.headers
    assert ("retry-after", "3") in answer.headers
