from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.servers import ServerThread, start_gateway, start_mock_engine


@pytest.fixture
def mock_engines() -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def factory(**kwargs: Any) -> ServerThread:
        server = start_mock_engine(**kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def gateways() -> Iterator[Callable[[dict[str, Any]], ServerThread]]:
    started: list[ServerThread] = []

    def factory(raw: dict[str, Any]) -> ServerThread:
        server = start_gateway(raw)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()
