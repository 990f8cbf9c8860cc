"""Property-based requests against a real gateway in front of mock engines (issue 19, the fuzz suite).

Bodies with any field the gateway reads missing, of a wrong type, huge, nested or unicode; bodies that
are no JSON object or no JSON; header values of every shape; wrong methods and unknown paths; and very
deep nesting. For each: never a 5xx, a contract-shaped 4xx (`contract.py`), exactly the refusal the
documented rules call for (`oracle.py`), and a 2xx only for a request those rules let through.
Bounded: `FUZZ_SETTINGS` (200 examples per property, 2 s per example).
"""

from __future__ import annotations

import uuid
from collections import Counter

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.openapi import OPENAPI_PATH
from gateway.api.request_parsing import Endpoint
from tests.fuzz.contract import UPSTREAM_STATUS, check_answer, check_error_shape
from tests.fuzz.fleet import FUZZ_SETTINGS, MAX_BODY_BYTES, MODEL, REWRITE, Fleet
from tests.fuzz.oracle import expected_refusal
from tests.fuzz.strategies import (
    FUZZED_ENDPOINTS,
    broken_bodies,
    object_requests,
    request_headers,
    wrong_type_bodies,
)

pytestmark = pytest.mark.timeout(300)
MODELS = frozenset({MODEL, REWRITE})
OPS_PATHS = ("/v1/models", "/healthz", "/health", "/readyz", "/metrics")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
OUTCOMES: Counter[str] = Counter()
"""What the body properties got: `served`, `gateway` (refused by the gateway), `engine` (by an engine)."""


def _send(fleet: Fleet, endpoint: Endpoint, raw: bytes, headers: dict[str, bytes]) -> httpx.Response:
    sent = dict(headers)
    if "idempotency-key" in sent:  # never a reuse across examples (that is a 400 of its own)
        sent["idempotency-key"] += b"-" + uuid.uuid4().hex.encode()
    return fleet.client.post(endpoint.value, content=raw, headers={k.encode(): v for k, v in sent.items()})


def _check_proxied(fleet: Fleet, endpoint: Endpoint, raw: bytes, headers: dict[str, bytes]) -> None:
    response = _send(fleet, endpoint, raw, headers)
    check_answer(response, headers.get("x-request-id"))
    expected = expected_refusal(endpoint, raw, headers, models=MODELS, max_body_bytes=MAX_BODY_BYTES)
    reason = response.headers.get("x-gateway-reject-reason")
    if expected is not None:
        assert (response.status_code, reason) == expected, (
            response.status_code,
            response.text[:300],
            raw[:300],
        )
        OUTCOMES["gateway"] += 1
        return
    # A request the gateway must pass on: served (2xx), or refused by the engine itself.
    if response.status_code >= 400:
        assert reason == UPSTREAM_STATUS, (response.status_code, response.text[:300], raw[:300])
        OUTCOMES["engine"] += 1
        return
    OUTCOMES["served"] += 1
    assert 200 <= response.status_code < 300, response.status_code
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n"), response.text[-300:]


@pytest.mark.parametrize("endpoint", FUZZED_ENDPOINTS, ids=lambda e: e.name.lower())
@FUZZ_SETTINGS
@given(data=st.data())
def test_object_bodies_with_wrong_fields_and_headers(
    fleet: Fleet, endpoint: Endpoint, data: st.DataObject
) -> None:
    raw = data.draw(object_requests(endpoint), label="body")
    headers = data.draw(request_headers, label="headers")
    _check_proxied(fleet, endpoint, raw, headers)


@pytest.mark.parametrize("endpoint", FUZZED_ENDPOINTS, ids=lambda e: e.name.lower())
@FUZZ_SETTINGS
@given(data=st.data())
def test_one_field_of_a_wrong_type(fleet: Fleet, endpoint: Endpoint, data: st.DataObject) -> None:
    """Each example a type error: the gateway refuses the fields it checks (400), the engine the others
    (its own 4xx, passed through); a client's bad input is never a 5xx, whoever reads it."""
    _check_proxied(fleet, endpoint, data.draw(wrong_type_bodies(endpoint), label="body"), {})


@FUZZ_SETTINGS
@given(endpoint=st.sampled_from(FUZZED_ENDPOINTS), data=st.data())
def test_bodies_that_are_no_json_object(fleet: Fleet, endpoint: Endpoint, data: st.DataObject) -> None:
    raw = data.draw(broken_bodies(endpoint), label="body")
    headers = data.draw(request_headers, label="headers")
    _check_proxied(fleet, endpoint, raw, headers)


_PATH_CHARS = st.characters(codec="ascii", categories=["L", "N"], include_characters="-._~%/")
paths = (
    st.sampled_from([e.value for e in FUZZED_ENDPOINTS] + list(OPS_PATHS))
    | st.sampled_from(["/", "/v1", "/v1/", "/V1/models", "/v1/chat", "/openapi", OPENAPI_PATH, "/admin"])
    | st.text(_PATH_CHARS, max_size=30).map(lambda s: "/" + s)
)


@pytest.fixture(scope="module")
def ops_paths(fleet: Fleet) -> tuple[str, ...]:
    """The operations paths, with the OpenAPI document once gateway/app.py serves it."""
    served = fleet.client.get(OPENAPI_PATH).status_code == 200
    return (*OPS_PATHS, OPENAPI_PATH) if served else OPS_PATHS


@FUZZ_SETTINGS
@given(method=st.sampled_from(METHODS), path=paths)
def test_wrong_methods_and_unknown_paths(
    fleet: Fleet, ops_paths: tuple[str, ...], method: str, path: str
) -> None:
    proxied = path in {e.value for e in Endpoint}
    if proxied and method == "POST":
        return  # the body properties cover these
    response = fleet.client.request(method, path, follow_redirects=False)
    status = response.status_code
    check_answer(response, request_id=status >= 400)  # ops successes carry no request id
    if proxied:
        assert status == 405 and response.headers.get("allow") == "POST", (status, response.headers)
    elif path in ops_paths:
        if method == "GET":  # HEAD is a 405 too: the operations routes answer GET only
            assert status in ((200, 503) if path == "/readyz" else (200,)), status
        else:
            assert status == 405 and "GET" in response.headers.get("allow", ""), (status, response.headers)
    elif status >= 400:
        assert check_error_shape(response) in {"not_found", "method_not_allowed", "unauthorized"}
    else:
        assert 300 <= status < 400, status  # a trailing-slash redirect at most


@pytest.mark.parametrize(
    "endpoint", [e for e in FUZZED_ENDPOINTS if e is not Endpoint.CHAT], ids=lambda e: e.name.lower()
)
@pytest.mark.parametrize("role", [[], {}, ["user"], {"a": 1}], ids=repr)
def test_unhashable_role_outside_chat(fleet: Fleet, endpoint: Endpoint, role: object) -> None:
    """Found by this suite: outside chat `messages` is not validated, yet it is rendered for routing keys;
    a list or object role was a 500 (TypeError: unhashable). Now never a 5xx."""
    body = {"model": MODEL, "prompt": "x", "input": "x", "tokens": [104], "messages": [{"role": role}]}
    check_answer(fleet.client.post(endpoint.value, json=body))


def _deep(depth: int) -> bytes:
    return b"[" * depth + b'"x"' + b"]" * depth


LOCATIONS: dict[str, tuple[Endpoint, int, bytes]] = {
    # location: (endpoint, levels around the deep value, body template)
    "content": (
        Endpoint.CHAT,
        3,
        b'{"model": "%s", "stream": %s, "messages": [{"role": "user", "content": DEEP}]}',
    ),
    "prompt": (Endpoint.COMPLETIONS, 1, b'{"model": "%s", "stream": %s, "prompt": DEEP}'),
    "input": (Endpoint.EMBEDDINGS, 1, b'{"model": "%s", "stream": %s, "input": DEEP}'),
    "other field": (
        Endpoint.CHAT,
        1,
        b'{"model": "%s", "stream": %s, "messages": [{"role": "user", "content": "x"}], "metadata": DEEP}',
    ),
    "message field": (
        Endpoint.CHAT,
        3,
        b'{"model": "%s", "stream": %s, "messages": [{"role": "user", "content": "x", "name": DEEP}]}',
    ),
    "stream_options": (
        Endpoint.COMPLETIONS,
        2,
        b'{"model": "%s", "stream": %s, "prompt": "x", "stream_options": {"x": DEEP}}',
    ),
}
PROMPT_LOCATIONS = ("content", "prompt", "input")
DEPTHS = (16, 17, 251, 252, 253, 254, 255, 1000, 1020, 1021, 1022, 1023, 1024, 5000)
JSON_READ_LEVELS = 1024  # orjson reads a document nested up to 1024 levels deep
JSON_WRITE_LEVELS = 254  # ... but writes one only up to 254
BODY_LEVELS = 128  # so the gateway refuses any body nested deeper than this (request_parsing)


def _deep_cases() -> list[object]:
    cases: list[object] = []
    for location, (endpoint, _around, _) in LOCATIONS.items():
        for model, stream in ((MODEL, False), (MODEL, True), (REWRITE, False)):
            if stream and not endpoint.can_stream:
                continue
            for depth in DEPTHS:
                cases.append(
                    pytest.param(
                        location,
                        model,
                        stream,
                        depth,
                        id=f"{location}-{model}-{'stream' if stream else 'plain'}-{depth}",
                    )
                )
    return cases


@pytest.mark.parametrize(("location", "model", "stream", "depth"), _deep_cases())
def test_deeply_nested_bodies(fleet: Fleet, location: str, model: str, stream: bool, depth: int) -> None:
    """Very deep JSON anywhere in the body: a 400 (the prompt fields past 16 levels, anything past 128 —
    the gateway re-serialises bodies and orjson writes at most 254; it was a 500) or served."""
    endpoint, around, template = LOCATIONS[location]
    raw = (template % (model.encode(), b"true" if stream else b"false")).replace(b"DEEP", _deep(depth))
    response = fleet.client.post(endpoint.value, content=raw)
    check_answer(response)
    if around + depth > BODY_LEVELS or (location in PROMPT_LOCATIONS and depth > 16):
        assert response.status_code == 400, response.text[:300]
        assert response.headers["x-gateway-reject-reason"] == "bad_request"


def test_the_body_properties_reached_the_engines() -> None:
    """The properties are only worth something if a good share of the generated requests is valid and
    served, and a good share is refused: each outcome is at least a tenth of the requests sent."""
    total = sum(OUTCOMES.values())
    if total == 0:
        pytest.skip("the body properties did not run in this session")
    print(f"body properties: {dict(OUTCOMES)}")
    assert OUTCOMES["served"] >= total / 10 and OUTCOMES["gateway"] >= total / 10, OUTCOMES
