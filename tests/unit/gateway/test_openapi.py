"""The OpenAPI document of the client surface (issue 19, item 11): valid OpenAPI 3.1 (checked with
openapi-spec-validator), every proxied endpoint and operations path, every reason of the error contract
under the status its error class answers, the gateway's headers, and request bodies that refuse what the
gateway's parser refuses and accept what it accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from gateway.api.openapi import OPENAPI_PATH, openapi_document
from gateway.api.openapi_errors import PASSTHROUGH, ROUTE_CODES
from gateway.api.request_parsing import Endpoint, parse_request
from gateway.api.response_calls import response_call
from gateway.app import _proxy_route
from gateway.base.error_mapping import REJECT_REASON_HEADER, error_statuses, to_response
from gateway.base.errors import (
    BadRequest,
    ErrorCode,
    GatewayError,
    MethodNotAllowed,
    Overloaded,
    Unavailable,
    UpstreamStatusError,
)
from gateway.base.surface import ApiSurface
from tests.servers import ServerThread, gateway_settings

DOC = openapi_document()
OPS_PATHS = ("/v1/models", "/healthz", "/health", "/readyz", "/metrics", OPENAPI_PATH)
GATEWAY_HEADERS = (
    "x-request-id",
    "x-gateway-priority",
    "x-session-id",
    "x-gateway-ttft-timeout-ms",
    "x-gateway-idle-timeout-ms",
    "Idempotency-Key",
)
SUCCESS_HEADERS = (
    "x-request-id",
    "x-gateway-pool",
    "x-gateway-replica",
    "x-gateway-route",
    "x-gateway-queue-ms",
    "Server-Timing",
)
MINIMAL: dict[Endpoint, dict[str, Any]] = {
    Endpoint.CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    Endpoint.COMPLETIONS: {"model": "m", "prompt": "hi"},
    Endpoint.EMBEDDINGS: {"model": "m", "input": "hi"},
    Endpoint.TOKENIZE: {"model": "m", "prompt": "hi"},
    Endpoint.DETOKENIZE: {"model": "m", "tokens": [104, 105]},
    Endpoint.RERANK: {"model": "m", "query": "q", "documents": ["a", "b"]},
    Endpoint.RERANK_UNVERSIONED: {"model": "m", "query": "q", "documents": ["a"]},
    Endpoint.SCORE: {"model": "m", "text_1": "a", "text_2": ["b"]},
    Endpoint.POOLING: {"model": "m", "input": "hi"},
    Endpoint.CLASSIFY: {"model": "m", "input": "hi"},
    Endpoint.MESSAGES: {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
    Endpoint.COUNT_TOKENS: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    Endpoint.RESPONSES: {"model": "m", "input": "hi"},
}
DROP = object()
RESPONSE_ID_PATHS = (
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel",
    "/v1/responses/{response_id}/input_items",
)


def _proxied_operations() -> list[Any]:
    """Every proxied operation of the document: each endpoint's POST, and the Responses id calls."""
    out = [pytest.param(endpoint.value, "post", id=endpoint.name.lower()) for endpoint in Endpoint]
    for path in RESPONSE_ID_PATHS:
        for method in DOC["paths"][path]:
            out.append(pytest.param(path, method, id=f"{method}-{path}"))
    return out


PROXIED_OPERATIONS = _proxied_operations()


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = DOC
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _body_validator(endpoint: Endpoint) -> Draft202012Validator:
    schema = DOC["paths"][endpoint.value]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator(schema)


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(DOC)
    assert DOC["openapi"].startswith("3.1.")


def test_the_document_is_json_and_a_fresh_copy_each_time() -> None:
    assert orjson.loads(orjson.dumps(DOC)) == DOC
    mine = openapi_document()
    mine["paths"].clear()
    assert openapi_document() == DOC


def test_every_proxied_endpoint_is_documented_as_a_post() -> None:
    for endpoint in Endpoint:
        assert set(DOC["paths"][endpoint.value]) == {"post"}, endpoint


def test_the_operations_paths_are_documented_as_gets() -> None:
    for path in OPS_PATHS:
        assert set(DOC["paths"][path]) == {"get"}, path
    assert set(DOC["paths"]) == {*(e.value for e in Endpoint), *OPS_PATHS, *RESPONSE_ID_PATHS}


@pytest.mark.parametrize("path", RESPONSE_ID_PATHS)
def test_the_response_id_calls_are_documented_as_the_app_routes_them(path: str) -> None:
    """The methods documented on each `/v1/responses/{response_id}[/cancel]` path are the ones the app
    routes there (`gateway.app._proxy_route`, whose 405 names the others), the id a path parameter."""
    concrete = path.format(response_id="resp_abc123")
    endpoint, allow = _proxy_route(concrete)
    assert endpoint is Endpoint.RESPONSES and response_call(concrete) is not None
    assert {method.upper() for method in DOC["paths"][path]} == set(allow)
    for operation in DOC["paths"][path].values():
        assert "requestBody" not in operation, "the id calls carry no body"
        (id_parameter,) = [p for p in operation["parameters"] if "$ref" not in p]
        assert id_parameter["in"] == "path" and id_parameter["name"] == "response_id"
        assert id_parameter["required"] is True
        assert Draft202012Validator(id_parameter["schema"]).is_valid("resp_0a9F-_")
        assert not Draft202012Validator(id_parameter["schema"]).is_valid("a/b")
        assert "response_not_found" in operation["responses"]["200"]["description"]
        assert set(_documented_reasons(operation["responses"], 404)) >= {
            "response_not_found",
            "response_state_lost",
        }


def test_the_new_surfaces_are_documented_with_their_error_responses() -> None:
    """Responses, Messages, count_tokens and the pooling endpoints: a POST with a body, every error
    status, and (Messages) Anthropic's error shape said in the description."""
    surfaces = (
        Endpoint.RESPONSES,
        Endpoint.MESSAGES,
        Endpoint.COUNT_TOKENS,
        Endpoint.RERANK,
        Endpoint.RERANK_UNVERSIONED,
        Endpoint.SCORE,
        Endpoint.POOLING,
        Endpoint.CLASSIFY,
    )
    statuses = {str(status) for status in set(error_statuses().values()) if status not in (404, 405)}
    for endpoint in surfaces:
        operation = DOC["paths"][endpoint.value]["post"]
        assert operation["requestBody"]["required"] is True
        assert statuses <= set(operation["responses"]), endpoint
        streamed = "text/event-stream" in operation["responses"]["200"]["content"]
        assert streamed == endpoint.can_stream, endpoint
        description = operation["responses"]["200"]["description"]
        assert ("AnthropicErrorBody" in description) == (endpoint.surface is ApiSurface.ANTHROPIC)
    assert "response.completed" in DOC["paths"]["/v1/responses"]["post"]["responses"]["200"]["description"]


def test_every_reason_has_the_status_of_its_error_class() -> None:
    statuses = error_statuses()
    assert set(statuses) == set(ErrorCode)
    assert statuses[ErrorCode.BAD_REQUEST] == 400 and statuses[ErrorCode.QUEUE_FULL] == 429
    assert statuses[ErrorCode.NOT_FOUND] == 404 and statuses[ErrorCode.METHOD_NOT_ALLOWED] == 405


def _documented_reasons(responses: dict[str, Any], status: int) -> list[str]:
    response = _resolve(responses[str(status)])
    reasons: list[str] = response["headers"]["x-gateway-reject-reason"]["schema"]["enum"]
    assert response["headers"]["x-gateway-reject-reason"]["required"] is True
    return reasons


@pytest.mark.parametrize(("path", "method"), PROXIED_OPERATIONS)
def test_every_proxied_reason_is_documented_on_every_proxied_operation(path: str, method: str) -> None:
    responses = DOC["paths"][path][method]["responses"]
    for code, status in error_statuses().items():
        if code in ROUTE_CODES or code is PASSTHROUGH:
            continue
        assert str(code) in _documented_reasons(responses, status), (code, status)
    for key in responses:
        if key.isdigit() and int(key) >= 400:
            assert str(PASSTHROUGH) in _documented_reasons(responses, int(key))
    assert "default" in responses  # an engine's own error status, passed through


def test_route_reasons_are_documented_with_allow_on_405() -> None:
    responses = DOC["components"]["responses"]
    assert responses["Route404"]["headers"]["x-gateway-reject-reason"]["schema"]["enum"] == ["not_found"]
    route405 = responses["Route405"]["headers"]
    assert route405["x-gateway-reject-reason"]["schema"]["enum"] == ["method_not_allowed"]
    assert route405["Allow"]["required"] is True


def _instances() -> list[GatewayError]:
    """One instance of every error class (the ones with a Retry-After carry one)."""
    out: list[GatewayError] = []
    pending = list(GatewayError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "code" not in vars(cls) or cls is UpstreamStatusError or cls.__module__ != "gateway.base.errors":
            continue
        if cls is MethodNotAllowed:
            out.append(MethodNotAllowed("no", allow=("POST",)))
        elif issubclass(cls, Overloaded | Unavailable):
            out.append(cls("an error", retry_after_s=2.5))
        else:
            out.append(cls("an error"))
    return out


@pytest.mark.parametrize("error", _instances(), ids=lambda e: str(e.code))
def test_the_gateway_error_answers_match_their_documented_response(error: GatewayError) -> None:
    answer = to_response(error)
    headers = dict(answer.headers)
    route = error.code in ROUTE_CODES
    name = f"Route{answer.status}" if route else f"Error{answer.status}"
    documented = DOC["components"]["responses"][name]
    assert headers[REJECT_REASON_HEADER] in documented["headers"]["x-gateway-reject-reason"]["schema"]["enum"]
    if "retry-after" in headers:
        assert "Retry-After" in documented["headers"]
    body_schema = {"$ref": "#/components/schemas/ErrorBody", "components": DOC["components"]}
    Draft202012Validator(body_schema).validate(orjson.loads(answer.body))


@pytest.mark.parametrize("error", [e for e in _instances() if e.code not in ROUTE_CODES], ids=str)
@pytest.mark.parametrize(
    ("path", "method"),
    [("/v1/messages", "post"), ("/v1/responses", "post"), ("/v1/responses/{response_id}", "delete")],
)
def test_each_surface_renders_errors_as_its_operations_document(
    error: GatewayError, path: str, method: str
) -> None:
    """The body the gateway sends on each surface (Anthropic's shape on /v1/messages, OpenAI's on the
    Responses calls) is valid against the operation's documented response for that status, and the
    reason header is one it lists."""
    surface = Endpoint.MESSAGES.surface if path == "/v1/messages" else Endpoint.RESPONSES.surface
    answer = to_response(error, surface)
    responses = DOC["paths"][path][method]["responses"]
    assert dict(answer.headers)[REJECT_REASON_HEADER] in _documented_reasons(responses, answer.status)
    schema = {
        **_resolve(responses[str(answer.status)])["content"]["application/json"]["schema"],
        "components": DOC["components"],
    }
    body = orjson.loads(answer.body)
    Draft202012Validator(schema).validate(body)
    anthropic = {"$ref": "#/components/schemas/AnthropicErrorBody", "components": DOC["components"]}
    assert Draft202012Validator(anthropic).is_valid(body) == (surface is ApiSurface.ANTHROPIC)


def test_an_engine_error_body_passed_through_matches_the_documented_response() -> None:
    engine_body = orjson.dumps(
        {"error": {"message": "x", "type": "BadRequestError", "param": None, "code": 400}}
    )
    error = UpstreamStatusError("x", status=400, body=engine_body, content_type="application/json")
    answer = to_response(error)
    responses = DOC["paths"][Endpoint.CHAT.value]["post"]["responses"]
    assert dict(answer.headers)[REJECT_REASON_HEADER] in _documented_reasons(responses, 400)
    schema = {
        **_resolve(responses["400"])["content"]["application/json"]["schema"],
        "components": DOC["components"],
    }
    Draft202012Validator(schema).validate(orjson.loads(answer.body))


def test_the_gateway_headers_are_documented() -> None:
    parameters = DOC["components"]["parameters"]
    for name in GATEWAY_HEADERS:
        assert parameters[name]["in"] == "header" and parameters[name]["name"] == name
    for path, method in (param.values for param in PROXIED_OPERATIONS):
        operation = DOC["paths"][path][method]
        refs = {p["$ref"].rsplit("/", 1)[1] for p in operation["parameters"] if "$ref" in p}
        assert refs == set(GATEWAY_HEADERS)
        assert set(operation["responses"]["200"]["headers"]) == set(SUCCESS_HEADERS)
    for status in (429, 503):
        assert "Retry-After" in DOC["components"]["responses"][f"Error{status}"]["headers"]
    assert DOC["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"


def _with(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = {**body, **changes}
    return {k: v for k, v in out.items() if v is not DROP}


def _refused_by_gateway(endpoint: Endpoint) -> list[dict[str, Any]]:
    base = MINIMAL[endpoint]
    cases = [
        _with(base, model=DROP),
        _with(base, model=5),
        _with(base, model=""),
        _with(base, stream="yes"),
        _with(base, stream=1),
        _with(base, max_tokens=-1),
        _with(base, max_tokens=1.5),
        _with(base, max_tokens="5"),
        _with(base, max_completion_tokens=True),
        _with(base, stream_options=[1]),
    ]
    if endpoint is Endpoint.CHAT:
        cases += [
            _with(base, messages=DROP),
            _with(base, messages=[]),
            _with(base, messages=[1]),
            _with(base, messages=[{"content": "x"}]),
            _with(base, messages=[{"role": 5}]),
        ]
    if endpoint is Endpoint.COMPLETIONS:
        cases += [_with(base, prompt=DROP), _with(base, prompt=None)]
    if endpoint is Endpoint.EMBEDDINGS:
        cases += [_with(base, input=DROP), _with(base, input=None)]
    if not endpoint.can_stream:
        cases.append(_with(base, stream=True))
    return cases


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_the_documented_body_refuses_what_the_gateway_refuses(endpoint: Endpoint) -> None:
    validator = _body_validator(endpoint)
    for body in _refused_by_gateway(endpoint):
        with pytest.raises(BadRequest):
            parse_request(endpoint, orjson.dumps(body))
        assert not validator.is_valid(body), body


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_the_documented_body_accepts_what_the_gateway_accepts(endpoint: Endpoint) -> None:
    validator = _body_validator(endpoint)
    base = MINIMAL[endpoint]
    accepted = [
        base,
        _with(base, max_tokens=0, max_completion_tokens=7, user="u", extra={"anything": [1, None]}),
        _with(base, stream=False, stream_options={"include_usage": True}),
    ]
    if endpoint.can_stream:
        accepted.append(_with(base, stream=True))
    for body in accepted:
        parse_request(endpoint, orjson.dumps(body))
        validator.validate(body)


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_stream_null_is_documented_and_accepted(endpoint: Endpoint) -> None:
    body = _with(MINIMAL[endpoint], stream=None)
    _body_validator(endpoint).validate(body)
    assert parse_request(endpoint, orjson.dumps(body)).stream is False


def test_the_gateway_serves_the_document(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> None:
    engine = mock_engines(model="m")
    gateway = gateways(gateway_settings([{"model": "m", "replicas": {"static": [engine.url]}}]))
    response = httpx.get(gateway.url + OPENAPI_PATH, timeout=10.0)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == DOC
