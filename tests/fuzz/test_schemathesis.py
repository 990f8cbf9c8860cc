"""A short schema-driven run (issue 19, item 11): schemathesis generates requests from the gateway's
OpenAPI document — valid ones, and for the proxied operations invalid ones too — against the fuzz fleet,
and checks every answer against the document (status, content type, headers, body schema), the error
contract (`contract.py`) and that none is a 5xx. Offline: the document is loaded from
`gateway.api.openapi`, the requests go to 127.0.0.1. Bounded: 25 examples per operation and mode.

Three adjustments to what is generated, all for the fleet rather than the gateway: request bodies name
the fleet's model (an unknown one is a 404 before anything else is exercised), the deadline headers
are fixed at 5 s (the document allows 1 ms, which can rightly end in a 504 before a token arrives), and
the `response_id` of the Responses id calls is one the fleet stores (retrieve and cancel), one created
for the run (delete), or one the gateway never relayed — a random id would only ever be the gateway's
404. The bodiless id calls run positive cases only (a negative case would mutate the path into another
route's).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.api.openapi import OPENAPI_PATH, openapi_document
from tests.fuzz.contract import (
    ANTHROPIC_PATHS,
    REASON,
    UPSTREAM_STATUS,
    check_anthropic_body,
    documented_reasons,
)
from tests.fuzz.fleet import MODEL, Fleet, create_response

pytestmark = pytest.mark.timeout(300)
SCHEMA_SETTINGS = settings(
    max_examples=25,
    deadline=2000,
    database=None,
    suppress_health_check=list(HealthCheck),
)
FIXED_HEADERS = {"x-gateway-ttft-timeout-ms": "5000", "x-gateway-idle-timeout-ms": "5000"}
UNKNOWN_ID = "resp_never_relayed"


def _generation_document() -> dict[str, Any]:
    """The served document with the request bodies' `model` pinned to the fleet's (module docstring)."""
    doc = copy.deepcopy(openapi_document())
    for item in doc["paths"].values():
        post = item.get("post")
        if post is not None and "requestBody" in post:
            body = post["requestBody"]["content"]["application/json"]["schema"]
            body["properties"]["model"] = {"const": MODEL}
    return doc


def _operations() -> list[Any]:
    operations = []
    for result in schemathesis.openapi.from_dict(_generation_document()).get_all_operations():
        assert isinstance(result, Ok), result  # schemathesis reads every operation of the document
        operations.append(result.ok())
    return operations


OPERATIONS = _operations()


def error_contract(ctx: Any, response: Any, case: Any) -> bool | None:
    """The error contract on a schemathesis response (see `contract.py`)."""
    status = response.status_code
    if not 400 <= status < 500:
        return None
    reason = response.headers.get(REASON, [None])[0]
    assert reason in documented_reasons(status), f"{status} with reason {reason!r}"
    if case.operation.path in ANTHROPIC_PATHS:  # the same errors in Anthropic's body shape
        check_anthropic_body(response.json(), status, reason, case.operation.label)
        return True
    error = response.json()["error"]
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert error["code"] == (status if reason == UPSTREAM_STATUS else reason), error
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    error_contract,
]


def _has_body(operation: Any) -> bool:
    return "requestBody" in operation.definition.raw


def _cases() -> list[Any]:
    params = []
    for operation in OPERATIONS:
        modes = [GenerationMode.POSITIVE]
        if operation.method.upper() == "POST" and _has_body(operation):
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            params.append(pytest.param(operation, mode, id=f"{operation.label}-{mode.value}"))
    return params


@pytest.fixture(scope="module")
def deletable(fleet: Fleet) -> Iterator[list[str]]:
    """Responses created for the delete operation (one per example at most)."""
    yield [create_response(fleet.client, MODEL) for _ in range(SCHEMA_SETTINGS.max_examples)]


def _response_ids(fleet: Fleet, operation: Any, deletable: list[str]) -> list[str] | None:
    """The ids a Responses id call is generated with (module docstring), or None for other operations."""
    if "{response_id}" not in operation.path:
        return None
    if operation.method.upper() == "DELETE":
        return [*deletable, UNKNOWN_ID]
    return [*fleet.stored, UNKNOWN_ID]


@pytest.mark.parametrize(("operation", "mode"), _cases())
def test_schema_driven_requests_get_documented_answers(
    fleet: Fleet, deletable: list[str], operation: Any, mode: GenerationMode
) -> None:
    if operation.path == OPENAPI_PATH and httpx.get(fleet.url + OPENAPI_PATH).status_code == 404:
        pytest.skip("GET /openapi.json is not routed in gateway/app.py yet")
    proxied = _has_body(operation) or "{response_id}" in operation.path
    headers = FIXED_HEADERS if proxied else None
    ids = _response_ids(fleet, operation, deletable)
    if ids is None:
        strategy = operation.as_strategy(generation_mode=mode, headers=headers)
    else:  # one strategy per id, built once
        strategy = st.one_of(
            [
                operation.as_strategy(
                    generation_mode=mode, headers=headers, path_parameters={"response_id": i}
                )
                for i in ids
            ]
        )

    @SCHEMA_SETTINGS
    @given(case=strategy)
    def run(case: Any) -> None:
        case.call_and_validate(base_url=fleet.url, checks=CHECKS)

    run()
