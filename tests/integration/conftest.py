from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.app import GatewayApp
from tests.servers import ServerThread, gateway_settings

MODEL = "test-model"


@dataclass
class Fleet:
    gateway: ServerThread
    engines: list[ServerThread]

    @property
    def app(self) -> GatewayApp:
        app: GatewayApp = self.gateway.app
        return app

    def inflight(self) -> dict[str, int]:
        return {r.replica_id: r.inflight_requests for r in self.app.state.registry.all_replicas()}

    def inflight_gauge(self) -> dict[str, float]:
        samples = self.app.state.metrics.inflight.collect()[0].samples
        return {s.labels["replica"]: s.value for s in samples}


def pool(engines: list[ServerThread], **overrides: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engine": "vllm",
        "replicas": {"static": [e.url for e in engines]},
        "policy": "least-load",
        **overrides,
    }


@pytest.fixture
def fleet(
    mock_engines: Callable[..., ServerThread], gateways: Callable[[dict[str, Any]], ServerThread]
) -> Fleet:
    engines = [mock_engines(model=MODEL) for _ in range(3)]
    gateway = gateways(gateway_settings([pool(engines)]))
    return Fleet(gateway, engines)
