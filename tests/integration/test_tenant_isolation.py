"""Stored state belongs to its tenant (in-memory state): another tenant's response id or idempotency
key is an unknown one (tests/stored_state.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import MODEL, pool
from tests.servers import ServerThread, gateway_settings
from tests.stored_state import ROUTES, TENANTS, assert_idempotency_isolated, assert_route_isolated


@pytest.fixture
def engines(mock_engines: Callable[..., ServerThread]) -> list[ServerThread]:
    return [mock_engines(model=MODEL) for _ in range(2)]


@pytest.fixture
def gateway(engines: list[ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]) -> ServerThread:
    return gateways(gateway_settings([pool(engines)], tenants=TENANTS))


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_another_tenants_response_is_not_found(route: str, gateway: ServerThread) -> None:
    assert_route_isolated(route, MODEL, gateway.url, gateway.url)


def test_another_tenants_idempotency_key_is_a_new_key(
    engines: list[ServerThread], gateway: ServerThread
) -> None:
    assert_idempotency_isolated(
        MODEL, gateway.url, gateway.url, lambda: sum(e.app.counters.started for e in engines)
    )
