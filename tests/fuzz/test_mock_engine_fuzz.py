"""The mock engine itself under the same bodies (issue 19, item 10): a client's bad input is a 400 with
vLLM's error body (Anthropic's on the Messages endpoints; on the Responses API a `previous_response_id`
it never stored is vLLM's 404), never a 5xx, whatever the endpoint; a request it accepts is answered 200.

Straight to an engine of the fuzz fleet (no gateway in between), so nothing is refused before it.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.request_parsing import Endpoint
from gateway.base.surface import ApiSurface
from tests.fuzz.fleet import FUZZ_SETTINGS, Fleet
from tests.fuzz.strategies import FUZZED_ENDPOINTS, broken_bodies, object_requests, wrong_type_bodies

pytestmark = pytest.mark.timeout(300)
ENDPOINTS = list(FUZZED_ENDPOINTS)


def _check(client: httpx.Client, endpoint: Endpoint, raw: bytes) -> None:
    response = client.post(endpoint.value, content=raw)
    status = response.status_code
    assert status < 500, (status, response.text[:300], raw[:300])
    if status == 200:
        return
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = orjson.loads(response.content)
    if endpoint is Endpoint.RESPONSES and status == 404:  # a previous_response_id it never stored
        assert body["error"]["code"] == 404 and body["error"]["param"] == "previous_response_id", body
        return
    assert status == 400, (status, response.text[:300], raw[:300])
    if endpoint.surface is ApiSurface.ANTHROPIC:  # Anthropic's shape, whatever the client got wrong
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert set(body["error"]) == {"type", "message"}, body
        return
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == "BadRequestError" and error["code"] == 400, error
    assert error["param"] is None or isinstance(error["param"], str), error


@pytest.fixture(scope="module")
def engine(fleet: Fleet) -> httpx.Client:
    return httpx.Client(base_url=fleet.engines[0].url, timeout=httpx.Timeout(15.0))


@FUZZ_SETTINGS
@given(endpoint=st.sampled_from(ENDPOINTS), data=st.data())
def test_wrong_types_are_400s(engine: httpx.Client, endpoint: Endpoint, data: st.DataObject) -> None:
    _check(engine, endpoint, data.draw(wrong_type_bodies(endpoint), label="body"))


@FUZZ_SETTINGS
@given(endpoint=st.sampled_from(ENDPOINTS), data=st.data())
def test_any_body_is_a_200_or_a_400(engine: httpx.Client, endpoint: Endpoint, data: st.DataObject) -> None:
    raw = data.draw(object_requests(endpoint) | broken_bodies(endpoint), label="body")
    _check(engine, endpoint, raw)
