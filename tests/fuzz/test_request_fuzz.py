"""Property-based requests against a real gateway in front of mock engines (issue 19, the fuzz suite).

Bodies with any field the gateway reads missing, of a wrong type, huge, nested or unicode; bodies that
are no JSON object or no JSON; header values of every shape; wrong methods and unknown paths; the
Responses API's id calls on stored, fresh and unknown ids; and very deep nesting. Every proxied endpoint
but `/rerank` (the same as `/v1/rerank`): the OpenAI ones, Responses (with `previous_response_id` naming
a stored response of either pool, or none), Anthropic Messages and count_tokens (errors in Anthropic's
shape) and the pooling endpoints. For each: never a 5xx, a contract-shaped 4xx (`contract.py`), exactly
the refusal the documented rules call for (`oracle.py`), and a 2xx only for a request those rules let
through, a stream ending as its surface ends one. Bounded: `FUZZ_SETTINGS` (200 examples per property,
2 s per example); the newer surfaces share their examples per surface (`ENDPOINT_GROUPS`).
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.openapi import OPENAPI_PATH
from gateway.api.request_parsing import Endpoint
from gateway.base.surface import ApiSurface
from tests.fuzz.contract import UPSTREAM_STATUS, check_answer, check_error_shape
from tests.fuzz.fleet import (
    FUZZ_SETTINGS,
    MAX_BODY_BYTES,
    MODEL,
    REWRITE,
    SERVED,
    Fleet,
    create_response,
)
from tests.fuzz.oracle import expected_refusal, response_call_refusal
from tests.fuzz.strategies import (
    ENDPOINT_GROUPS,
    FUZZED_ENDPOINTS,
    broken_bodies,
    object_requests,
    request_headers,
    routed_bodies,
    with_stored_ids,
    wrong_type_bodies,
)

pytestmark = pytest.mark.timeout(300)
OPS_PATHS = ("/v1/models", "/healthz", "/health", "/readyz", "/metrics")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
OUTCOMES: Counter[str] = Counter()
"""What the body properties got: `served`, `gateway` (refused by the gateway), `engine` (by an engine)."""


def _headers(headers: dict[str, bytes]) -> dict[bytes, bytes]:
    sent = dict(headers)
    if "idempotency-key" in sent:  # never a reuse across examples (that is a 400 of its own)
        sent["idempotency-key"] += b"-" + uuid.uuid4().hex.encode()
    return {k.encode(): v for k, v in sent.items()}


STREAM_ENDS = {
    ApiSurface.OPENAI: (b"data: [DONE]",),
    ApiSurface.ANTHROPIC: (b"event: message_stop",),
    ApiSurface.RESPONSES: (b"event: response.completed", b"event: response.incomplete"),
}
"""How a served stream of each surface ends: the first line of its last event."""


def _ends_as_its_surface(surface: ApiSurface, body: bytes) -> bool:
    if not body.endswith(b"\n\n"):
        return False
    last = body[:-2].rsplit(b"\n\n", 1)[-1]
    return last.split(b"\n", 1)[0] in STREAM_ENDS[surface]


def _check_proxied(fleet: Fleet, endpoint: Endpoint, raw: bytes, headers: dict[str, bytes]) -> None:
    raw = with_stored_ids(raw, fleet.stored)
    response = fleet.client.post(endpoint.value, content=raw, headers=_headers(headers))
    check_answer(response, headers.get("x-request-id"))
    expected = expected_refusal(
        endpoint, raw, headers, served=SERVED, stored=fleet.stored, max_body_bytes=MAX_BODY_BYTES
    )
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
        assert _ends_as_its_surface(endpoint.surface, response.content), response.text[-300:]


def _group_id(group: tuple[Endpoint, ...]) -> str:
    return "+".join(endpoint.name.lower() for endpoint in group)


@pytest.mark.parametrize("group", ENDPOINT_GROUPS, ids=_group_id)
@FUZZ_SETTINGS
@given(data=st.data())
def test_object_bodies_with_wrong_fields_and_headers(
    fleet: Fleet, group: tuple[Endpoint, ...], data: st.DataObject
) -> None:
    endpoint = data.draw(st.sampled_from(group), label="endpoint")
    raw = data.draw(object_requests(endpoint), label="body")
    headers = data.draw(request_headers, label="headers")
    _check_proxied(fleet, endpoint, raw, headers)


@pytest.mark.parametrize("group", ENDPOINT_GROUPS, ids=_group_id)
@FUZZ_SETTINGS
@given(data=st.data())
def test_one_field_of_a_wrong_type(fleet: Fleet, group: tuple[Endpoint, ...], data: st.DataObject) -> None:
    """Each example a type error: the gateway refuses the fields it checks (400), the engine the others
    (its own 4xx, passed through); a client's bad input is never a 5xx, whoever reads it."""
    endpoint = data.draw(st.sampled_from(group), label="endpoint")
    _check_proxied(fleet, endpoint, data.draw(wrong_type_bodies(endpoint), label="body"), {})


@FUZZ_SETTINGS
@given(endpoint=st.sampled_from(FUZZED_ENDPOINTS[5:]), data=st.data())
def test_valid_bodies_of_the_newer_surfaces_are_routed(
    fleet: Fleet, endpoint: Endpoint, data: st.DataObject
) -> None:
    """Valid Responses, Messages and pooling bodies for either pool or none, streamed or not, continuing
    a stored response of either pool or an unknown one: each the oracle's 404 (model, endpoint not
    served by `REWRITE`, stored response unknown or held by the other pool) or served, a stream ending
    as its surface's does."""
    _check_proxied(fleet, endpoint, data.draw(routed_bodies(endpoint), label="body"), {})


ID_CALLS = {"retrieve": ("GET", ""), "delete": ("DELETE", ""), "cancel": ("POST", "/cancel")}
unknown_ids = st.sampled_from(["resp_unknown", "x", "resp_" + "0" * 200]) | st.text(
    st.characters(codec="ascii", categories=["L", "N"], include_characters="-_~"), min_size=1, max_size=40
)


@FUZZ_SETTINGS
@given(
    call=st.sampled_from(list(ID_CALLS)),
    kind=st.sampled_from(["stored", "fresh", "unknown"]),
    pool=st.sampled_from([MODEL, REWRITE]),
    data=st.data(),
)
def test_response_id_calls(fleet: Fleet, call: str, kind: str, pool: str, data: st.DataObject) -> None:
    """`GET`/`DELETE /v1/responses/{id}` and `POST …/cancel` on a response the fleet stores (never
    deleted here), one created for this example, or an id the gateway never relayed: the gateway's own
    404 `response_not_found` for the last, the holder's answer otherwise (retrieve: the response,
    cancel: its 400 for a synchronous response, delete: 200, after which the id is the gateway's 404)."""
    method, suffix = ID_CALLS[call]
    headers = data.draw(request_headers, label="headers")
    replica = None
    if kind == "stored" and call != "delete":
        response_id = next(rid for rid, holder in fleet.stored.items() if holder == pool)
    elif kind == "unknown":
        response_id, pool = data.draw(unknown_ids, label="id"), ""
    else:
        response_id = create_response(fleet.client, pool)
        replica = fleet.client.get(f"/v1/responses/{response_id}").headers["x-gateway-replica"]
    response = fleet.client.request(method, f"/v1/responses/{response_id}{suffix}", headers=_headers(headers))
    check_answer(response, headers.get("x-request-id"))
    expected = response_call_refusal(response_id, pool or None, headers, served=SERVED)
    reason = response.headers.get("x-gateway-reject-reason")
    if expected is not None:
        assert (response.status_code, reason) == expected, (response.status_code, response.text[:300])
        return
    if replica is not None:
        assert response.headers["x-gateway-replica"] == replica, "answered by the replica that holds it"
    if call == "cancel":
        assert (response.status_code, reason) == (400, UPSTREAM_STATUS), response.text[:300]
        return
    assert response.status_code == 200 and response.json()["id"] == response_id, response.text[:300]
    if call == "delete":
        after = fleet.client.get(f"/v1/responses/{response_id}")
        assert after.status_code == 404 and after.headers["x-gateway-reject-reason"] == "response_not_found"


@FUZZ_SETTINGS
@given(endpoint=st.sampled_from(FUZZED_ENDPOINTS), data=st.data())
def test_bodies_that_are_no_json_object(fleet: Fleet, endpoint: Endpoint, data: st.DataObject) -> None:
    raw = data.draw(broken_bodies(endpoint), label="body")
    headers = data.draw(request_headers, label="headers")
    _check_proxied(fleet, endpoint, raw, headers)


_PATH_CHARS = st.characters(codec="ascii", categories=["L", "N"], include_characters="-._~%/")
RESPONSE_ID_PATHS = {
    "/v1/responses/resp_unknown": "GET, DELETE",
    "/v1/responses/resp_unknown/cancel": "POST",
    "/v1/responses/resp_unknown/input_items": "GET",
}
"""The Responses id paths (an id the gateway never relayed) and the methods each answers (`Allow`)."""
paths = (
    st.sampled_from([e.value for e in Endpoint] + list(OPS_PATHS) + list(RESPONSE_ID_PATHS))
    | st.sampled_from(["/", "/v1", "/v1/", "/V1/models", "/v1/chat", "/openapi", OPENAPI_PATH, "/admin"])
    | st.sampled_from(["/v1/responses/", "/v1/responses/a/b", "/v1/responses/a/cancel/x", "/v1/messages/"])
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
    if method == "HEAD":  # served as GET, without a body
        assert response.content == b""
        method = "GET"
    if path in RESPONSE_ID_PATHS:
        allow = RESPONSE_ID_PATHS[path]
        if method in allow.split(", "):  # the gateway's own 404: it never relayed that id
            assert (status, response.headers.get("x-gateway-reject-reason")) == (404, "response_not_found")
        else:
            assert status == 405 and response.headers.get("allow") == allow, (status, response.headers)
    elif proxied:
        assert status == 405 and response.headers.get("allow") == "POST", (status, response.headers)
    elif path in ops_paths:
        if method == "GET":  # the operations routes answer GET (and HEAD) only
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
