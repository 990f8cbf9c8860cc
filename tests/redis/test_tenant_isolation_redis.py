"""Stored state belongs to its tenant with `state.backend: redis`: two gateway instances share the
records, and another tenant's response id or idempotency key is an unknown one through either
(tests/stored_state.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.servers import ServerThread, gateway_settings
from tests.stored_state import ROUTES, TENANTS, assert_idempotency_isolated, assert_route_isolated

from .conftest import REDIS_URL

pytestmark = pytest.mark.redis

MODEL = "shared-model"


@pytest.fixture
def engines(mock_engines: Callable[..., ServerThread]) -> list[ServerThread]:
    return [mock_engines(model=MODEL) for _ in range(2)]


@pytest.fixture
def instances(
    engines: list[ServerThread], gateways: Callable[[dict[str, Any]], ServerThread], key_prefix: str
) -> list[ServerThread]:
    pool = {"model": MODEL, "replicas": {"static": [e.url for e in engines]}, "policy": "least-load"}
    state = {"backend": "redis", "url": REDIS_URL, "key_prefix": key_prefix}
    return [gateways(gateway_settings([pool], state=state, tenants=TENANTS)) for _ in range(2)]


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_another_tenants_response_is_not_found_through_any_instance(
    route: str, instances: list[ServerThread]
) -> None:
    first, second = instances
    assert_route_isolated(route, MODEL, first.url, second.url)
    assert_route_isolated(route, MODEL, second.url, second.url)


def test_another_tenants_idempotency_key_is_a_new_key_through_any_instance(
    engines: list[ServerThread], instances: list[ServerThread]
) -> None:
    first, second = instances
    assert_idempotency_isolated(
        MODEL, first.url, second.url, lambda: sum(e.app.counters.started for e in engines)
    )
